"""The watchdog tick: run every second by Celery beat (in-process when embedded)."""

from __future__ import annotations

import logging
import threading

from django.db import transaction

from breakers import liveness
from breakers.control import expire_overdue_commands
from breakers.heartbeats import check_heartbeats

log = logging.getLogger(__name__)
BEAT = "beat"
EMBEDDED_TICK_EVERY = 5  # watchdog ticks per evaluation tick (beat's 5 s in the server mode)
EMBEDDED_ESCALATION_EVERY = 30  # … per escalation expiry run (beat's 30 s)
EMBEDDED_NOTIFY_EVERY = 15  # … per notification-rounds sweep (beat's 15 s)


def watchdog_tick(stop_job) -> list[int]:
    """Record the beat, brake silent jobs, expire overdue commands, hand hung jobs to
    ``stop_job(command_id)``."""
    liveness.record(BEAT)
    check_heartbeats()
    with transaction.atomic():
        to_stop = expire_overdue_commands()
        for command_id in to_stop:
            transaction.on_commit(lambda command_id=command_id: stop_job(command_id))
    return to_stop


def start_in_process_watchdog(interval: float = 1.0) -> threading.Thread:
    """Embedded mode: no beat process, so a daemon thread ticks instead (make demo shows it)."""
    from breakers.control import stop_hung_job
    from breakers.escalation_actions import expire_escalations
    from breakers.tasks import tick_evaluations
    from incidents.notifications import fire_due_rounds

    def loop() -> None:
        stopper, ticks = threading.Event(), 0
        while not stopper.wait(interval):
            ticks += 1
            try:
                watchdog_tick(stop_hung_job)
                if ticks % EMBEDDED_TICK_EVERY == 0:
                    tick_evaluations()  # eager in the embedded mode: runs right here
                if ticks % EMBEDDED_ESCALATION_EVERY == 0:
                    expire_escalations()
                if ticks % EMBEDDED_NOTIFY_EVERY == 0:
                    fire_due_rounds()  # notification escalation rounds (beat: every 15 s)
            except Exception:  # keep ticking: one bad tick must not end the watchdog
                log.exception("watchdog tick failed")

    thread = threading.Thread(target=loop, name="brakeline-watchdog", daemon=True)
    thread.start()
    return thread
