"""Two real Celery beats on one Redis (config/beat.py): one sends the periodic tasks; when it
is killed, the other takes the lease over within its expiry and sends from then on."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from bench._stack import celery_command
from config.beat import LEASE_SECONDS, TICK_SECONDS
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

SENT = "Sending due task watchdog"


class Beat:
    """A beat subprocess whose log lines are timestamped as they arrive."""

    def __init__(self, folder: Path, name: str) -> None:
        from tests.conftest import server_environment

        self.name = name
        self.sent: list[float] = []
        self.process = subprocess.Popen(
            celery_command(
                "beat", "--loglevel", "info", "--schedule", str(folder / f"{name}-schedule")
            ),
            cwd=ROOT,
            env=server_environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if SENT in line:
                self.sent.append(time.monotonic())

    def sent_between(self, start: float, end: float) -> int:
        return sum(1 for at in self.sent if start <= at <= end)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(20)


def wait_for(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_one_beat_sends_and_the_other_takes_over_when_it_dies(tmp_path):
    beats = [Beat(tmp_path, "a"), Beat(tmp_path, "b")]
    try:
        wait_for(lambda: any(len(beat.sent) >= 3 for beat in beats), "a beat to lead")
        window = time.monotonic()
        time.sleep(4)
        counts = [beat.sent_between(window, time.monotonic()) for beat in beats]
        assert sorted(counts)[0] == 0 and sorted(counts)[1] >= 3, counts  # one clock, not two
        leader, standby = sorted(beats, key=lambda beat: -beat.sent_between(window, 1e12))
        leader.stop(signal.SIGKILL)  # no clean hand-over: the lease must run out
        killed = time.monotonic()
        wait_for(lambda: standby.sent_between(killed, 1e12) > 0, "the standby to take over")
        took_over = min(at for at in standby.sent if at >= killed)
        # The lease's expiry, a tick and the watchdog's own period (1 s), with room for a
        # loaded machine: not the minute a dead single beat would have cost.
        assert took_over - killed <= LEASE_SECONDS + TICK_SECONDS + 1.0 + 2.0
    finally:
        for beat in beats:
            beat.stop(signal.SIGKILL)


def test_a_clean_stop_hands_the_lease_over_at_once(tmp_path):
    first = Beat(tmp_path, "first")
    try:
        wait_for(lambda: len(first.sent) >= 2, "the first beat to lead")
        second = Beat(tmp_path, "second")
        try:
            time.sleep(2)
            assert second.sent == []
            first.stop(signal.SIGTERM)
            stopped = time.monotonic()
            wait_for(lambda: second.sent_between(stopped, 1e12) > 0, "the second to lead")
        finally:
            second.stop(signal.SIGKILL)
    finally:
        first.stop(signal.SIGKILL)
