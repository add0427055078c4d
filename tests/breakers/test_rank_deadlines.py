"""Per-rank heartbeat deadlines, through real HTTP heartbeats: one silent rank among
heartbeating ones is named by the watchdog; a paused job whose ranks fall silent alerts too."""

from __future__ import annotations

import pytest
import time_machine
from django.utils import timezone

from breakers.control.acknowledge import acknowledge_command
from breakers.control.commands import issue_command
from breakers.control.heartbeats import check_heartbeats
from breakers.control.watchdog import watchdog_tick
from breakers.models import Command
from incidents.alerts.lifecycle import AlertSignal, raise_or_update_alert
from incidents.jobs import move_job
from incidents.models import Alert, Incident, Job, JobStatus, TimelineEntry
from tests.support.authz import raise_alert

URL = "/api/v1/agent/heartbeat"
pytestmark = pytest.mark.django_db


@pytest.fixture
def two_ranks(agent, agent_post):
    """Two ranks heartbeating every 5 s at 1 s per step: each deadline is the 10 s floor."""

    def beat(rank, step, status="running"):
        body = {"step": step, "status": status, "rank": rank, "world_size": 2}
        body |= {"pid": 2000 + rank, "hostname": f"node-{rank}"}
        response = agent_post(URL, body)
        assert response.status_code == 200, response.content

    with time_machine.travel(timezone.now(), tick=False) as clock:
        for step in (0, 5, 10):
            beat(0, step)
            beat(1, step)
            clock.shift(5)
        yield agent, clock, beat


def test_a_silent_rank_alerts_while_the_other_heartbeats_and_is_named(two_ranks):
    agent, clock, beat = two_ranks
    # Rank 0 goes on (its beats used to reset the job's one deadline); rank 1 is silent.
    for step in (15, 20):
        assert check_heartbeats() == []
        beat(0, step)
        clock.shift(5)
    beat(0, 25)
    raised = check_heartbeats()  # 15 s after rank 1's last beat, its deadline 10 s
    assert len(raised) == 1 and check_heartbeats() == []
    alert = Alert.objects.get(pk=raised[0])
    assert alert.description.startswith(
        "rank 1 of 2 is silent (node-1, pid 2001); 1 other rank still heartbeating: "
    )
    assert alert.nodes == ["node-1"] and alert.step == 10
    assert alert.value == pytest.approx(15.0) and alert.threshold == pytest.approx(10.0)
    assert Command.objects.get(job_id=agent.job_id).kind == "checkpoint_and_pause"
    # Rank 0's heartbeats do not end the silence: rank 1 is still silent.
    beat(0, 30)
    assert Alert.objects.get(pk=alert.pk).status == "firing"
    assert Job.objects.get(pk=agent.job_id).heartbeat_overdue_since is not None
    beat(1, 30)  # rank 1 is back
    assert Alert.objects.get(pk=alert.pk).status == "resolved"
    assert Job.objects.get(pk=agent.job_id).heartbeat_overdue_since is None


def test_both_ranks_beating_never_alerts(two_ranks):
    _, clock, beat = two_ranks
    for step in range(15, 100, 5):
        beat(0, step)
        beat(1, step)
        clock.shift(5)
        assert check_heartbeats() == []


def test_a_paused_job_whose_rank_stops_heartbeating_alerts_without_pausing_again(two_ranks):
    agent, clock, beat = two_ranks
    Job.objects.filter(pk=agent.job_id).update(status=JobStatus.PAUSED)
    for _ in range(4):  # both hold, heartbeating as paused: watched, and quiet
        beat(0, 10, "paused")
        beat(1, 10, "paused")
        clock.shift(5)
        assert check_heartbeats() == []
    for _ in range(3):  # rank 0 died while holding; rank 1 goes on saying "paused"
        beat(1, 10, "paused")
        clock.shift(5)
    raised = check_heartbeats()
    assert len(raised) == 1
    alert = Alert.objects.get(pk=raised[0])
    assert (
        alert.severity == "L3" and "rank 0 of 2 is silent (node-0, pid 2000)" in alert.description
    )
    assert "while paused" in alert.description and alert.action == "none"
    assert not Command.objects.filter(job_id=agent.job_id).exists()
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED


def test_a_paused_job_gone_silent_altogether_alerts(two_ranks):
    agent, clock, _ = two_ranks
    Job.objects.filter(pk=agent.job_id).update(status=JobStatus.PAUSED)
    clock.shift(60)
    (raised,) = check_heartbeats()
    description = Alert.objects.get(pk=raised).description
    assert description.startswith("ranks 0, 1 of 2 are silent (node-0, node-1): ")


def test_silent_ranks_at_different_steps_name_the_one_behind(two_ranks):
    agent, clock, beat = two_ranks
    beat(0, 11)  # rank 0 got one step further, then both hung (rank 1 inside step 11)
    clock.shift(60)
    (raised,) = check_heartbeats()
    description = Alert.objects.get(pk=raised).description
    assert description.startswith(
        "rank 1 of 2 is hung (node-1, pid 2001): at step 10, behind the others; "
        "rank 0 waits on it at step 11: no heartbeat for"
    ), description
    assert Alert.objects.get(pk=raised).nodes == ["node-1"]


@pytest.fixture
def four_ranks(agent, agent_post):
    """Four ranks at 1 s per step, heartbeating every 5 s with where they are in their step."""

    def beat(rank, step, sync_step=None, **extra):
        body = {"step": step, "status": "running", "rank": rank, "world_size": 4}
        body |= {"pid": 3000 + rank, "hostname": f"gpu-{rank}"} | extra
        if sync_step is not None:
            body["sync_step"] = sync_step
        response = agent_post(URL, body)
        assert response.status_code == 200, response.content

    with time_machine.travel(timezone.now(), tick=False) as clock:
        for step in (0, 5, 10):
            for rank in range(4):
                beat(rank, step, sync_step=step)
            clock.shift(5)
        yield agent, clock, beat


def test_the_rank_that_never_entered_the_collective_is_named_not_every_silent_rank(four_ranks):
    agent, clock, beat = four_ranks
    # Step 11 for everybody; rank 2 then sleeps inside step 12's work while ranks 0, 1, 3
    # enter step 12's gradient sync and block there: all four fall silent within one interval.
    for rank in (0, 1, 3):
        beat(rank, 11, sync_step=12)
    beat(2, 11, sync_step=11)
    clock.shift(20)
    (raised,) = check_heartbeats()
    alert = Alert.objects.get(pk=raised)
    assert alert.description.startswith(
        "rank 2 of 4 is hung (gpu-2, pid 3002): at step 11 it never entered step 12's "
        "gradient sync; ranks 0, 1, 3 wait on it in that collective: no heartbeat for"
    ), alert.description
    assert alert.nodes == ["gpu-2"]


def test_a_job_whose_every_rank_is_silent_is_stopped_at_once(
    four_ranks, django_capture_on_commit_callbacks
):
    agent, clock, beat = four_ranks
    for rank in (0, 1, 3):
        beat(rank, 11, sync_step=12)
    beat(2, 11, sync_step=11)
    clock.shift(20)
    stopped: list[int] = []
    with django_capture_on_commit_callbacks(execute=True):
        to_stop = watchdog_tick(stopped.append)
    (command,) = Command.objects.filter(job_id=agent.job_id)
    assert command.kind == "checkpoint_and_pause" and command.status == "expired"
    assert to_stop == stopped == [command.pk]  # handed to the executor now, not 300 s later
    note = TimelineEntry.objects.get(data__event="all_ranks_silent")
    assert note.message.startswith(
        "Every rank of the job (4 of 4) is silent: nobody can acknowledge checkpoint_and_pause"
    ), note.message
    assert "Rank 2 of 4 is hung" in note.message
    with django_capture_on_commit_callbacks(execute=True):
        assert watchdog_tick(stopped.append) == []
    assert stopped == [command.pk]  # once


def test_a_job_with_a_rank_still_heartbeating_waits_for_the_acknowledgement(four_ranks):
    agent, clock, beat = four_ranks
    beat(2, 11)
    for step in (15, 20, 25, 30):  # three ranks go on; rank 2 is silent
        clock.shift(5)
        for rank in (0, 1, 3):
            beat(rank, step)
    assert watchdog_tick(lambda command_id: None) == []
    (command,) = Command.objects.filter(job_id=agent.job_id)
    assert command.status in ("pending", "delivered")
    assert not TimelineEntry.objects.filter(data__event="all_ranks_silent").exists()
    description = Alert.objects.get(job_id=agent.job_id).description
    assert (
        "rank 2 of 4 is silent (gpu-2, pid 3002); 3 other ranks still heartbeating" in description
    )


def test_a_paused_job_whose_every_rank_went_silent_says_nothing_holds_it(two_ranks):
    agent, clock, _ = two_ranks
    Job.objects.filter(pk=agent.job_id).update(status=JobStatus.PAUSED)
    clock.shift(60)
    watchdog_tick(lambda command_id: None)
    alert = Alert.objects.get(job_id=agent.job_id)
    assert "every rank is silent: its processes are gone or hung" in alert.description
    note = TimelineEntry.objects.get(data__event="all_ranks_silent")
    assert note.message.startswith("Every rank of the paused job (2 of 2) is silent")
    watchdog_tick(lambda command_id: None)
    assert TimelineEntry.objects.filter(data__event="all_ranks_silent").count() == 1
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED


@pytest.mark.parametrize("event", ["terminate", "finish"])
def test_the_alerts_of_a_job_that_ended_settle_with_a_timeline_row(two_ranks, event):
    agent, clock, _ = two_ranks
    clock.shift(60)
    (silence,) = check_heartbeats()
    failure = _communication_failure(agent.job_id)
    if event == "finish":  # (a finish comes from a job that runs, not one pausing)
        Job.objects.filter(pk=agent.job_id).update(status=JobStatus.RUNNING)
    assert move_job(agent.job_id, event)
    watchdog_tick(lambda command_id: None)
    for alert_id in (silence, failure.pk):
        alert = Alert.objects.get(pk=alert_id)
        assert alert.status == "resolved", alert.rule_key
        row = TimelineEntry.objects.get(alert_id=alert_id, kind="alert_resolved")
        ended = "terminated" if event == "terminate" else "finished"
        assert f"the job is {ended}: none of its processes is left to watch" in row.message
    assert Incident.objects.get(job_id=agent.job_id).status == "resolved"


def _communication_failure(job_id: int) -> Alert:
    """The default pack's communication-failure L4, as the engine raises it (health layer)."""
    now = timezone.now()
    signal = AlertSignal(
        rule_key="communication-failure",
        rule_name="Communication failure",
        layer="health",
        severity="L4",
        metric="comm.failures",
        node="node-1",
        value=1.0,
        threshold=0.0,
        description="comm.failures 1 past 0",
        step=10,
        time=now,
        first_step=10,
        first_time=now,
    )
    return raise_or_update_alert(job_id, signal, now=now).alert


def test_a_stability_alert_of_a_job_that_ended_waits_for_a_person(two_ranks):
    """A NaN, a rising loss, an environment changed across a resume: true of the training's
    state after its processes are gone, so they are not settled with the job."""
    agent, _, _ = two_ranks
    changed = raise_alert(agent.job_id, "L1", rule_key="environment-changed-across-resume")
    Job.objects.filter(pk=agent.job_id).update(status=JobStatus.RUNNING)
    assert move_job(agent.job_id, "finish")
    watchdog_tick(lambda command_id: None)
    assert Alert.objects.get(pk=changed.pk).status == "firing"


def test_an_isolate_node_nobody_can_apply_fails_with_why_once_the_job_ended(two_ranks):
    """An L4's terminate and isolate_node under torchrun (no Slurm): the ranks exit on the
    terminate, nobody drains the node; the isolate does not linger as delivered."""
    agent, _, _ = two_ranks
    alert = raise_alert(agent.job_id, "L4")
    terminate = issue_command(agent.job_id, "terminate", reason="L4", alert_id=alert.pk).command
    isolate = issue_command(
        agent.job_id, "isolate_node", reason="L4", params={"node": "node-1"}, alert_id=alert.pk
    ).command
    for rank in (0, 1):
        acknowledge_command(
            agent.job_id, terminate.pk, status="succeeded", result={"step": 10}, rank=rank
        )
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.TERMINATED
    watchdog_tick(lambda command_id: None)
    isolate.refresh_from_db()
    assert isolate.status == "failed"
    assert isolate.error == (
        "the job is terminated: no process is left to apply it; outside Slurm nothing drains "
        "node-1: take it out of service by hand"
    )
    row = TimelineEntry.objects.get(kind="command_acknowledged", data__command_id=isolate.pk)
    assert "take it out of service by hand" in row.message


def test_the_hung_rank_is_named_when_the_ranks_waiting_for_it_fall_silent_first(four_ranks):
    agent, clock, beat = four_ranks
    for rank in (0, 1, 3):  # passed step 11's boundary, then blocked in a collective there
        beat(rank, 11, sync_step=11)
    clock.shift(5)
    beat(2, 10, sync_step=11)  # rank 2 entered step 11's sync later, then hung before its boundary
    clock.shift(9.8)  # ranks 0, 1, 3 are past their deadlines; rank 2 not yet
    (raised,) = check_heartbeats()
    alert = Alert.objects.get(pk=raised)
    assert alert.description.startswith(
        "rank 2 of 4 is hung (gpu-2, pid 3002): at step 10, behind the others; "
        "ranks 0, 1, 3 wait on it at step 11: no heartbeat for"
    ), alert.description
    assert alert.nodes == ["gpu-2"]


@pytest.mark.parametrize(
    ("ranks", "last_words"),
    [
        (1, [(11, None)]),  # one process gone silent may be merely slow: its pause is waited for
        (4, [(11, None)] * 4),  # four ranks at one place, nothing said of a sync: the same
    ],
)
def test_silent_ranks_not_shown_stuck_in_a_collective_wait_for_their_pause(
    agent, agent_post, ranks, last_words
):
    with time_machine.travel(timezone.now(), tick=False) as clock:
        for step in (0, 5, 10):
            for rank in range(ranks):
                body = {"step": step, "status": "running", "rank": rank, "world_size": ranks}
                assert agent_post(URL, body).status_code == 200
            clock.shift(5)
        for rank, (step, sync_step) in enumerate(last_words):
            body = {"step": step, "status": "running", "rank": rank, "world_size": ranks}
            extra = {"sync_step": sync_step} if sync_step else {}
            assert agent_post(URL, body | extra).status_code == 200
        clock.shift(30)
        watchdog_tick(lambda command_id: None)
        (command,) = Command.objects.filter(job_id=agent.job_id)
        assert command.status in ("pending", "delivered")  # its 300 s stand
        assert not TimelineEntry.objects.filter(data__event="all_ranks_silent").exists()
