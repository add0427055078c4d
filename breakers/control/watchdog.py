"""The watchdog tick: run every second (config/schedule.py), by beat or in-process when embedded."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from django.db import transaction

from breakers.control import liveness
from breakers.control.acks import flag_split_commands
from breakers.control.commands import expire_overdue_commands
from breakers.control.heartbeats import check_heartbeats
from breakers.control.settle import settle_final_jobs
from breakers.control.silent_jobs import stop_silent_jobs
from breakers.control.unapplied import flag_unapplied_commands

log = logging.getLogger(__name__)
BEAT = "beat"


def watchdog_tick(stop_job: Callable[[int], object]) -> list[int]:
    """Record the beat, brake silent jobs (at once when every rank is), flag unapplied and
    split commands, settle the alerts of jobs that ended, expire overdue commands, hand hung
    jobs to ``stop_job(command_id)``."""
    liveness.record(BEAT)
    failed: Exception | None = None
    # Each duty runs whatever the others did: an error in one (a job's data nobody foresaw)
    # must not keep overdue commands from expiring for every job. The first error is raised
    # once all have run, so the tick still shows as failed.
    duties = (
        check_heartbeats,
        stop_silent_jobs,  # after the check: its alert first, then a brake nobody can answer
        flag_unapplied_commands,
        flag_split_commands,
        settle_final_jobs,
    )
    for duty in duties:
        try:
            duty()
        except Exception as error:
            log.exception("watchdog: %s failed", duty.__name__)
            failed = failed or error
    with transaction.atomic():
        to_stop = expire_overdue_commands()
        for command_id in to_stop:
            transaction.on_commit(partial(stop_job, command_id))
    if failed is not None:
        raise failed
    return to_stop
