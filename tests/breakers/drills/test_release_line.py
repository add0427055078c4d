"""The scorecard's release line waits for the SDK's note after a confirmed brake: the process
releases once the console's answer to its acknowledgement reaches it, and the console (which
the drill reads) committed that acknowledgement before, so on a loaded machine the drill can
see the job paused well before the release hooks have run."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from breakers.drills import runner
from breakers.drills.launch import RELEASE_MARKER
from breakers.models import Command, CommandKind, CommandStatus
from incidents.models import Job

pytestmark = pytest.mark.django_db


class HoldingSandbox:
    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir

    def alive(self) -> bool:
        return True

    def exit_code(self) -> int | None:
        return None


def test_the_release_line_waits_for_the_release_after_a_confirmed_brake(agent, tmp_path):
    job = Job.objects.get(pk=agent.job_id)
    brake = Command(job=job, kind=CommandKind.CHECKPOINT_AND_PAUSE, status=CommandStatus.SUCCEEDED)
    hooks_ran = threading.Event()
    # The SDK's release, a while after the console has the ack (the drill sees "paused" first).
    note = threading.Timer(
        1.5, lambda: ((tmp_path / RELEASE_MARKER).write_text("1 42\n"), hooks_ran.set())
    )
    note.start()
    try:
        facts = runner._release_facts(job, HoldingSandbox(tmp_path), None, brake)
    finally:
        note.join()
    assert hooks_ran.is_set()
    assert facts["release_hook"] is True and facts["alive"] is True


def test_without_a_confirmed_brake_nothing_is_waited_for(agent, tmp_path):
    job = Job.objects.get(pk=agent.job_id)
    failed = Command(job=job, kind=CommandKind.CHECKPOINT_AND_PAUSE, status=CommandStatus.FAILED)
    facts = runner._release_facts(job, HoldingSandbox(tmp_path), None, failed)
    assert facts["release_hook"] is False  # a failed save releases nothing (disk full drill)
