"""Periodic duties isolate each job's work: one job's bad data never stops a duty for others.

A duty (the unapplied-command check, the metric roll-up, compaction) loops over jobs. Each
job's part runs in ``per_job``: a database error rolls back that job's part only (its own
savepoint, or — for a part that commits in bounded transactions of its own, such as the
roll-up's batches — those transactions, so no lock is held longer than before); the failure is
logged with the job, counted per duty in Redis (``brakeline_duty_failures_total`` on
``/metrics``, which ``deploy/monitoring/brakeline-rules.yml`` alerts on), and the loop goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.core.cache import cache
from django.db import transaction

log = logging.getLogger(__name__)
DUTIES = ("flag_unapplied_commands", "roll_up", "compact")
_KEY = "brakeline:duty-failures:{}"


@dataclass
class PartOutcome:
    succeeded: bool = False


@contextmanager
def per_job(duty: str, job_id: int, *, savepoint: bool = True) -> Iterator[PartOutcome]:
    """Run one job's part of ``duty``; a failure is logged and counted, never raised.
    ``savepoint=False`` for a part whose writes are in transactions of its own."""
    outcome = PartOutcome()
    try:
        if savepoint:
            with transaction.atomic():
                yield outcome
        else:
            yield outcome
        outcome.succeeded = True
    except Exception:
        log.exception("%s failed for job %s; the other jobs go on", duty, job_id)
        count_failure(duty)


def count_failure(duty: str) -> None:
    key = _KEY.format(duty)
    try:
        cache.add(key, 0, timeout=None)
        cache.incr(key)
    except Exception:  # Redis down: the log line above still says it
        log.warning("could not count the failure of %s", duty)


def failures() -> dict[str, int]:
    """Failures per duty since Redis was last emptied (a counter for Prometheus)."""
    try:
        found = cache.get_many([_KEY.format(duty) for duty in DUTIES])
    except Exception:
        return {}
    return {duty: int(found.get(_KEY.format(duty)) or 0) for duty in DUTIES}
