"""Every periodic task, once. Celery beat's schedule (server mode) and the in-process ticker
(embedded mode, where there is no beat process) are both built from ``PERIODIC``, so the two
modes cannot drift apart."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from celery.schedules import crontab

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Periodic:
    key: str
    task: str  # the task's explicit name
    every: float | None = None  # seconds; or
    at: crontab | None = None  # a time of day (beat only: the embedded mode is a demo)
    expires: float | None = None  # a run that waited longer in the queue is dropped
    why: str = ""


def _tick_seconds() -> float:
    raw = os.environ.get("BRAKELINE_TICK_SECONDS", "5").strip()
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value >= 1:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"BRAKELINE_TICK_SECONDS={raw!r} is not a number of seconds ≥ 1."
        )
    return value


PERIODIC: tuple[Periodic, ...] = (
    # Its own last run is what /api/v1/health reports as the beat's age.
    Periodic(
        "watchdog",
        "control.watchdog",
        every=1.0,
        expires=5,
        why="heartbeat deadlines, unacknowledged commands, hung jobs to the executor",
    ),
    Periodic(
        "expire-escalations",
        "escalations.expire",
        every=30.0,
        expires=25,
        why="expire undecided escalation requests (optionally into an automatic L3)",
    ),
    Periodic(
        "breakers-tick-evaluations",
        "detection.tick_evaluations",
        every=_tick_seconds(),
        expires=10,
        why="a tick per running job: pending points, time-based detectors",
    ),
    Periodic(
        "notification-rounds",
        "notifications.fire_due_rounds",
        every=15.0,
        expires=14,
        why="notification rounds that are due (a safety net for lost ETA tasks)",
    ),
    Periodic(
        "notification-sweeper",
        "notifications.sweep_deliveries",
        every=10.0,
        expires=9,
        why="re-queue deliveries whose lease ran out (a worker died mid-send, a lost task)",
    ),
    Periodic(
        "drill-schedule",
        "rulesets.schedule_drills",
        at=crontab(minute=17),
        why="each team's drill set, once per BRAKELINE_DRILL_INTERVAL_SECONDS (monthly)",
    ),
    Periodic(
        "metric-rollups",
        "storage.roll_up",
        every=10.0,
        expires=9,
        why="merge new metric points into their 10 s / 1 min rollups per rank",
    ),
    Periodic(
        "metric-compaction",
        "storage.compact",
        every=60.0,
        expires=50,
        why="fold points the evaluator and rollups are past into blocks (~8 B a point)",
    ),
    Periodic(
        "metric-retention",
        "storage.prune",
        every=300.0,
        expires=240,
        why="delete raw points past the raw window (never around incidents), old rollups",
    ),
    Periodic(
        "rank-stragglers",
        "pace.check_stragglers",
        every=30.0,
        expires=25,
        why="straggler scores of running ranks: a performance finding per slow rank",
    ),
    Periodic(
        "notification-digest",
        "notifications.daily_digest",
        at=crontab(hour=8, minute=0),
        why="e-mail each team's performance findings of the last 24 h",
    ),
)


def beat_schedule(entries: tuple[Periodic, ...] = PERIODIC) -> dict[str, dict[str, Any]]:
    """``CELERY_BEAT_SCHEDULE``."""
    schedule = {}
    for entry in entries:
        item: dict[str, Any] = {"task": entry.task, "schedule": entry.every or entry.at}
        if entry.expires is not None:
            item["options"] = {"expires": entry.expires}
        schedule[entry.key] = item
    return schedule


def start_embedded_ticker(interval: float = 1.0) -> threading.Thread:
    """Embedded mode: a daemon thread runs the periodic tasks in this process (eagerly), every
    ``every`` seconds, counted in ticks of ``interval`` (make demo shows it)."""
    from config.celery import app

    app.loader.import_default_modules()
    due = [(app.tasks[e.task], max(1, round(e.every / interval))) for e in PERIODIC if e.every]

    def loop() -> None:
        stopper, ticks = threading.Event(), 0
        while not stopper.wait(interval):
            ticks += 1
            for task, every in due:
                if ticks % every:
                    continue
                try:
                    task.apply()  # eager, here; one failing task must not end the ticker
                except Exception:
                    log.exception("periodic task %s failed", task.name)

    thread = threading.Thread(target=loop, name="brakeline-ticker", daemon=True)
    thread.start()
    return thread
