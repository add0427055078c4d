"""A web process that holds its agents' requests unserved has heard them only up to the oldest
one's arrival (breakers.control.backlog, breakers.control.hearing).

Real PostgreSQL and the real ASGI stack Daphne serves agents with (the gate, then the lean
route), run in a thread of this process: a rank's heartbeat waits there, on a row lock another
connection holds, past the rank's deadline. The watchdog must not take that wait for the
rank's silence, must still catch a job silent since before the backlog, and once the backlog
clears must still catch a rank that truly went silent during it, a full deadline later.
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connections
from django.db.models import F
from django.utils import timezone

from breakers.agent.service import heartbeat_reply
from breakers.control.backlog import AGENT_REQUESTS
from breakers.control.hearing import (
    BACKLOG_AFTER_SECONDS,
    PROCESS,
    beacon,
    heard_until,
    hearing_state,
)
from breakers.control.heartbeats import check_heartbeats
from breakers.models import Hearing, WebBeacon
from console.agent_lean import agent_http_stack
from incidents.models import Alert, Job, JobRank
from tests.incidents.test_heartbeat_row_lock import waiting_on_a_lock
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

WORLD = 2
# The ranks' deadlines run out this long after the test sets them: after the held
# heartbeat arrived, before the watchdog looks.
DEADLINE_IN = 1.5


@pytest.fixture(autouse=True)
def judged_by_beacon(settings):
    settings.JUDGE_SILENCE_BY_BEACON = True


def _body(rank: int, step: int) -> bytes:
    body = {"step": step, "status": "running", "rank": rank, "world_size": WORLD}
    return json.dumps(body | {"pid": 7000 + rank, "hostname": f"gpu-{rank}"}).encode()


def _deadline(job_id: int, seconds: float, heard_ago: float) -> None:
    """Every rank of the job (and the job) last heard ``heard_ago`` s ago, due in ``seconds``."""
    now = timezone.now()
    fields = {
        "heartbeat_deadline": now + timedelta(seconds=seconds),
        "last_heartbeat_at": now - timedelta(seconds=heard_ago),
    }
    Job.objects.filter(pk=job_id).update(**fields)
    JobRank.objects.filter(job_id=job_id).update(**fields)


def _hold_rank_row(job_id: int, holding: threading.Event, release: threading.Event) -> None:
    """Rank 0's row locked from another connection: its heartbeat waits until the release."""
    with connections["default"].cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute(
            f"SELECT 1 FROM {JobRank._meta.db_table} WHERE job_id = %s AND rank = 0 FOR UPDATE",
            [job_id],
        )
        holding.set()
        release.wait(120)
        cursor.execute("COMMIT")
    connections["default"].close()


def _post_heartbeat(token: str, body: bytes, answers: list[int]) -> None:
    """One heartbeat through the gate and the lean route, as Daphne would hand it over."""
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    headers = [
        (b"authorization", f"Bearer {token}".encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    scope = {"type": "http", "method": "POST", "path": "/api/v1/agent/heartbeat"}
    try:
        async_to_sync(agent_http_stack(None))(scope | {"headers": headers}, receive, send)
        answers.append(sent[0]["status"])
    finally:
        connections["default"].close()


def _alerted_jobs(alert_ids: list[int]) -> set[int]:
    return set(Alert.objects.filter(pk__in=alert_ids).values_list("job_id", flat=True))


@pytest.fixture
def two_jobs(make_agent):
    """Job A: two ranks heartbeating. Job B: silent since long before anything here."""
    waiting, silent = make_agent(), make_agent()
    for job in (waiting, silent):
        for rank in range(WORLD):
            heartbeat_reply(job.job_id, _body(rank, 10))
    _deadline(silent.job_id, seconds=-30, heard_ago=90)
    beacon()
    beacon()  # the Hearing row, then this process's own
    return waiting, silent


def test_a_heartbeat_held_by_a_backlogged_web_process_is_not_the_ranks_silence(two_jobs):
    waiting, silent = two_jobs
    _deadline(waiting.job_id, seconds=DEADLINE_IN, heard_ago=1)
    holding, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_rank_row, args=(waiting.job_id, holding, release))
    holder.start()
    answers: list[int] = []
    try:
        assert holding.wait(60)
        body = _body(0, 11)
        request = threading.Thread(target=_post_heartbeat, args=(waiting.token, body, answers))
        request.start()
        wait_for(waiting_on_a_lock, "rank 0's heartbeat waiting on its row")
        # Held past the threshold and past the ranks' deadlines.
        wait_for(lambda: AGENT_REQUESTS.oldest_age() > DEADLINE_IN + 0.2, "a backlog")
        due = Job.objects.get(pk=waiting.job_id).heartbeat_deadline
        wait_for(lambda: timezone.now() > due, "the ranks' deadlines to pass")
        beacon()
        # The job whose heartbeat waits is not braked; the one silent before the backlog is.
        assert _alerted_jobs(check_heartbeats()) == {silent.job_id}
        assert heard_until(timezone.now()) < due  # heard up to the held heartbeat's arrival
        assert WebBeacon.objects.get(pk=PROCESS).lag_seconds > BACKLOG_AFTER_SECONDS
    finally:
        release.set()
        holder.join(60)
    request.join(60)
    assert answers == [200]
    _a_rank_silent_through_the_backlog_is_caught_a_full_deadline_later(waiting.job_id)


def _a_rank_silent_through_the_backlog_is_caught_a_full_deadline_later(job_id: int) -> None:
    """Rank 1 sent nothing all along: its deadline ran out during the backlog."""
    before = JobRank.objects.get(job_id=job_id, rank=1).heartbeat_deadline
    forgiven = beacon()  # nothing held any more: the backlog cleared
    assert forgiven > BACKLOG_AFTER_SECONDS
    moved = JobRank.objects.get(job_id=job_id, rank=1).heartbeat_deadline - before
    assert moved.total_seconds() == pytest.approx(forgiven, abs=0.01)
    assert WebBeacon.objects.get(pk=PROCESS).peak_lag_seconds == 0.0
    # The console goes on hearing: past the moved deadline, rank 1 is caught, rank 0 is not.
    later = timedelta(seconds=forgiven + DEADLINE_IN)
    Hearing.objects.update(heard_at=F("heard_at") + later)
    raised = check_heartbeats(timezone.now() + later)
    assert _alerted_jobs(raised) == {job_id}
    description = Alert.objects.get(pk__in=raised).description
    assert description.startswith("rank 1 of 2 is silent"), description


def _other_process(beat_ago: float, lag: float, peak: float | None = None) -> WebBeacon:
    """Another web process's row, as its beacon wrote it ``beat_ago`` s before the tier's last
    (``peak``: its backlog's worst lag, when it was worse than at that beacon)."""
    beat = Hearing.objects.get().heard_at - timedelta(seconds=beat_ago)
    return WebBeacon.objects.create(
        process="other-host:4242:00",
        beat_at=beat,
        heard_to=beat - timedelta(seconds=lag),
        lag_seconds=lag,
        peak_lag_seconds=lag if peak is None else peak,
    )


def test_the_console_has_heard_up_to_its_most_backlogged_live_process(two_jobs):
    other = _other_process(beat_ago=0.3, lag=20)
    assert heard_until(timezone.now()) == other.heard_to
    assert hearing_state()["backlog_seconds"] == 20  # /api/v1/health's database.hearing
    waiting, silent = two_jobs
    _deadline(waiting.job_id, seconds=-5, heard_ago=30)  # ran out during the other's backlog
    assert _alerted_jobs(check_heartbeats()) == {silent.job_id}  # silent since before it


def test_a_dead_process_stops_counting_and_its_backlog_is_forgiven(two_jobs):
    waiting, silent = two_jobs
    _deadline(waiting.job_id, seconds=-5, heard_ago=30)
    # Its beacon stopped (the process is gone) while its backlog, 20 s at worst, was draining.
    other = _other_process(beat_ago=2.5, lag=5, peak=20)
    assert heard_until(timezone.now()) == Hearing.objects.get().heard_at
    before = Job.objects.get(pk=waiting.job_id).heartbeat_deadline
    forgiven = beacon()
    assert not WebBeacon.objects.filter(pk=other.pk).exists()
    assert forgiven == pytest.approx(22.5, abs=1.0)
    moved = Job.objects.get(pk=waiting.job_id).heartbeat_deadline - before
    assert moved.total_seconds() == pytest.approx(forgiven, abs=0.01)
    # Its agents' retries have their time again; the job silent since before it is caught.
    assert _alerted_jobs(check_heartbeats()) == {silent.job_id}


def test_a_dead_process_without_a_backlog_is_removed_and_forgives_nothing(two_jobs):
    other = _other_process(beat_ago=2.5, lag=0)
    assert beacon() == 0.0
    assert not WebBeacon.objects.filter(pk=other.pk).exists()
    assert Hearing.objects.get().outages == 0


def test_the_whole_tier_down_is_deafness_from_its_laggards_point(two_jobs):
    """Every process stopped, one of them backlogged: the return forgives from the earliest
    point the tier had heard up to."""
    _other_process(beat_ago=0.5, lag=10)
    Hearing.objects.update(heard_at=F("heard_at") - timedelta(seconds=25))
    WebBeacon.objects.update(
        beat_at=F("beat_at") - timedelta(seconds=25), heard_to=F("heard_to") - timedelta(seconds=25)
    )
    forgiven = beacon()
    assert forgiven == pytest.approx(35.5, abs=1.0)
    assert Hearing.objects.get().outages == 1
