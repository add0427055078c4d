"""The session's Celery worker as a test uses it: with the default rule pack, and idle again
before the test ends (the next test's flush must not race a running task)."""

from __future__ import annotations

import time

import pytest
from celery.worker import state as worker_state
from django.conf import settings

from tests.support.waiting import wait_for


def worker_idle() -> bool:
    """Nothing queued, nothing received, nothing running — twice, 50 ms apart."""
    from breakers.detection import tasks

    def idle() -> bool:
        busy = worker_state.active_requests or worker_state.reserved_requests
        return not busy and all(tasks._redis().llen(q) == 0 for q in settings.WORKER_QUEUES)

    return idle() and (time.sleep(0.05) or idle())


@pytest.fixture
def worker(celery_worker):
    """``celery_worker`` (tests/conftest.py) with the default rule pack: an earlier
    transactional test's flush emptied every table, the migrated rules included."""
    from breakers.detection.rules import install_default_pack

    install_default_pack()
    yield celery_worker
    wait_for(worker_idle, "the worker to be idle")
