"""The watchdog tick: run every second by Celery beat (in-process when embedded)."""

from __future__ import annotations

import logging
import threading

from django.db import transaction

from breakers import liveness
from breakers.control import expire_overdue_commands

log = logging.getLogger(__name__)
BEAT = "beat"


def watchdog_tick(stop_job) -> list[int]:
    """Record the beat, expire overdue commands, hand hung jobs to ``stop_job(command_id)``."""
    liveness.record(BEAT)
    with transaction.atomic():
        to_stop = expire_overdue_commands()
        for command_id in to_stop:
            transaction.on_commit(lambda command_id=command_id: stop_job(command_id))
    return to_stop


def start_in_process_watchdog(interval: float = 1.0) -> threading.Thread:
    """Embedded mode: no beat process, so a daemon thread ticks instead (make demo shows it)."""
    from breakers.control import stop_hung_job

    def loop() -> None:
        stopper = threading.Event()
        while not stopper.wait(interval):
            try:
                watchdog_tick(stop_hung_job)
            except Exception:  # keep ticking: one bad tick must not end the watchdog
                log.exception("watchdog tick failed")

    thread = threading.Thread(target=loop, name="brakeline-watchdog", daemon=True)
    thread.start()
    return thread
