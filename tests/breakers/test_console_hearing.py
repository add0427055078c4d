"""The console's own outage is not the jobs' silence (breakers.control.hearing).

The web tier's beacon says up to when the console could hear its agents; the watchdog judges
heartbeat and acknowledgement deadlines only up to it, and the first beacon after a deafness
moves the deadlines that ran meanwhile by its length. Real clock, real PostgreSQL: the beacon
is on the database's clock, so these tests place the moments around it instead of moving time.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone
from prometheus_client import generate_latest

from breakers.control.commands import expire_overdue_commands
from breakers.control.hearing import DEAF_AFTER_SECONDS, beacon, heard_until
from breakers.control.heartbeats import check_heartbeats
from breakers.models import Command, CommandStatus, Hearing
from breakers.monitoring.exposition import registry
from incidents.heartbeats import record_heartbeat
from incidents.models import Alert, Job, JobRank

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def judged_by_beacon(settings):
    settings.JUDGE_SILENCE_BY_BEACON = True


def _heard(seconds_ago: float) -> None:
    """The web tier's last beacon was this long ago (a beacon first, so the row exists)."""
    beacon()
    Hearing.objects.update(heard_at=F("heard_at") - timedelta(seconds=seconds_ago))


def _last_heard(job_id: int, seconds_ago: float, deadline_in: float) -> None:
    """The job (and its rank) last heartbeated this long ago, with this deadline from now."""
    now = timezone.now()
    fields = {
        "last_heartbeat_at": now - timedelta(seconds=seconds_ago),
        "heartbeat_deadline": now + timedelta(seconds=deadline_in),
    }
    Job.objects.filter(pk=job_id).update(**fields)
    JobRank.objects.filter(job_id=job_id).update(**fields)


@pytest.fixture
def silent_job(agent):
    """Heard 30 s ago, its deadline passed 20 s ago."""
    record_heartbeat(agent.job_id, step=40, status="running", pid=4321)
    _last_heard(agent.job_id, seconds_ago=30, deadline_in=-20)
    return agent


def test_a_deadline_that_ran_out_while_the_console_was_deaf_raises_nothing(silent_job):
    _heard(25)  # deaf since 25 s ago: the heartbeat came before, the deadline ran out after
    assert check_heartbeats() == []
    assert not Alert.objects.filter(job_id=silent_job.job_id).exists()


def test_the_same_silence_with_the_console_hearing_is_braked(silent_job):
    _heard(0)
    assert len(check_heartbeats()) == 1


def test_without_the_beacon_the_outage_would_have_been_the_jobs_silence(silent_job, settings):
    settings.JUDGE_SILENCE_BY_BEACON = False  # what the watchdog did before it listened
    _heard(25)
    assert len(check_heartbeats()) == 1


def test_the_return_moves_the_deadline_by_the_deafness_and_a_real_hang_is_caught_later(
    silent_job,
):
    _heard(25)
    before = Job.objects.get(pk=silent_job.job_id).heartbeat_deadline
    gap = beacon()  # the web tier is back
    assert gap == pytest.approx(25, abs=1.0) and gap > DEAF_AFTER_SECONDS
    job = Job.objects.get(pk=silent_job.job_id)
    rank = JobRank.objects.get(job_id=silent_job.job_id)
    assert (job.heartbeat_deadline - before).total_seconds() == pytest.approx(gap, abs=0.01)
    assert rank.heartbeat_deadline == job.heartbeat_deadline
    assert check_heartbeats() == []  # 5 s of its deadline are left, counted from the return
    hearing = Hearing.objects.get()
    assert (hearing.outages, hearing.deaf_seconds) == (1, pytest.approx(gap))
    # The job stays silent and the console keeps hearing: past the moved deadline, braked.
    Hearing.objects.update(heard_at=F("heard_at") + timedelta(seconds=6))
    assert len(check_heartbeats(timezone.now() + timedelta(seconds=6))) == 1


def test_a_heartbeat_heard_after_the_last_beacon_but_before_the_outage_is_moved_too(agent):
    """The web tier dies up to a beacon period after its last beacon: what it heard in that
    moment ran its deadline through the deafness as well."""
    record_heartbeat(agent.job_id, step=40, status="running", pid=4321)
    _last_heard(agent.job_id, seconds_ago=24.7, deadline_in=-19.7)  # 0.3 s after the beacon
    _heard(25)
    before = Job.objects.get(pk=agent.job_id).heartbeat_deadline
    gap = beacon()
    moved = Job.objects.get(pk=agent.job_id).heartbeat_deadline - before
    assert moved.total_seconds() == pytest.approx(gap, abs=0.01)
    assert check_heartbeats() == []


def test_a_heartbeat_after_the_outage_keeps_its_own_deadline(agent):
    _heard(25)
    beacon()
    record_heartbeat(agent.job_id, step=1, status="running", pid=4321)
    deadline = Job.objects.get(pk=agent.job_id).heartbeat_deadline
    _heard(0)
    assert Job.objects.get(pk=agent.job_id).heartbeat_deadline == deadline


def _command(job_id: int, issued_ago: float, window: float) -> Command:
    issued = timezone.now() - timedelta(seconds=issued_ago)
    return Command.objects.create(
        job_id=job_id,
        kind="checkpoint_and_pause",
        reason="test",
        issued_by_kind="system",
        idempotency_key=f"test-{issued_ago}",
        status=CommandStatus.DELIVERED,
        issued_at=issued,
        deliver_by=issued + timedelta(seconds=window),
    )


def test_an_acknowledgement_the_console_could_not_hear_is_not_late(agent):
    before = _command(agent.job_id, issued_ago=30, window=20)  # due 10 s ago
    _heard(25)
    assert expire_overdue_commands() == []
    assert Command.objects.get(pk=before.pk).status == CommandStatus.DELIVERED
    gap = beacon()
    moved = Command.objects.get(pk=before.pk).deliver_by - before.deliver_by
    assert moved.total_seconds() == pytest.approx(gap, abs=0.01)
    assert expire_overdue_commands() == []


def test_a_command_issued_during_the_deafness_gets_its_whole_window_from_the_return(agent):
    _heard(25)
    during = _command(agent.job_id, issued_ago=5, window=120)
    beacon()
    returned = Hearing.objects.get().heard_at
    assert Command.objects.get(pk=during.pk).deliver_by == returned + timedelta(seconds=120)


def test_beacons_without_a_gap_move_nothing(silent_job):
    _heard(0.5)
    before = Job.objects.get(pk=silent_job.job_id).heartbeat_deadline
    assert beacon() == 0.0
    assert Job.objects.get(pk=silent_job.job_id).heartbeat_deadline == before
    assert Hearing.objects.get().outages == 0


def test_no_beacon_yet_judges_on_the_clock(settings):
    now = timezone.now()
    assert heard_until(now) == now


def test_the_overdue_gauge_counts_silent_jobs_while_the_watchdog_is_away(silent_job):
    _heard(0)  # the console hears; nobody ran the watchdog (its beat is down)
    text = registry_text()
    assert "brakeline_jobs_heartbeat_overdue 1.0" in text
    assert "brakeline_console_outages_total 0.0" in text


def registry_text() -> str:
    return generate_latest(registry()).decode()
