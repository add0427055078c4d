"""A node's acknowledgements of one command, recorded together: the job's row locked once,
the ranks' answers written in one statement and counted once (breakers.control.acknowledge
``acknowledge_command_ranks``). While the command waits for other ranks, an acknowledgement
costs the same statements whatever the number of ranks that answered before, and reads none
of their answers; the final verdict is the one the ranks' answers one at a time make."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from breakers.agent.bundle import bundle_reply
from breakers.control.acknowledge import acknowledge_command
from breakers.control.acks import RULE_KEY
from breakers.control.commands import issue_command
from breakers.models import Command, CommandAck, CommandStatus
from incidents.models import Alert, Job, JobStatus

pytestmark = pytest.mark.django_db
WORLD = 64
NODE = range(56, 64)  # the last node's eight ranks
STEP = 122
# A waiting acknowledgement, one or a node's eight: its savepoint's two, the job's row locked,
# the command read, the ranks' answers inserted in one statement, and counted by status and
# step in one.
WAITING_ACK_STATEMENTS = 6
# A bundle of them adds its own transaction's two; no part of acknowledgements asks for the
# commands owed.
WAITING_BUNDLE_STATEMENTS = WAITING_ACK_STATEMENTS + 2


@pytest.fixture
def job(agent, agent_post) -> Job:
    """A job of 64 ranks, eight a node, each of them heard once."""
    parts = [{"path": "heartbeat", "body": json.dumps(beat(rank))} for rank in range(WORLD)]
    response = agent_post("/api/v1/agent/bundle", {"parts": parts})
    assert response.status_code == 200, response.content
    return Job.objects.get(pk=agent.job_id)


def beat(rank: int) -> dict:
    body = {"step": 100, "status": "running", "pid": 10 + rank, "hostname": f"node-{rank // 8}"}
    return body | {"rank": rank, "world_size": WORLD}


def pause(job: Job) -> Command:
    return issue_command(job.pk, "checkpoint_and_pause", reason="NaN", severity="L3").command


def answered_before(command: Command, ranks: range, step: int = STEP) -> None:
    """Ranks of other nodes that acknowledged it already."""
    now = timezone.now()
    CommandAck.objects.bulk_create(
        CommandAck(
            command=command,
            rank=rank,
            status=CommandStatus.SUCCEEDED,
            step=step,
            result={"step": step, "rank": rank},
            acknowledged_at=now,
        )
        for rank in ranks
    )
    Command.objects.filter(pk=command.pk).update(first_ack_at=now)


def ack_part(command: Command, rank: int, step: int = STEP, **extra) -> dict:
    body = {"status": "succeeded", "result": {"step": step, "rank": rank}} | extra
    return {"path": f"commands/{command.pk}/ack", "body": json.dumps(body)}


def serve(job: Job, parts: list[dict]) -> tuple[list[dict], list[str]]:
    job = Job.objects.get(pk=job.pk)  # as the agent gate hands it to the route
    with CaptureQueriesContext(connection) as queries:
        results = bundle_reply(job, json.dumps({"parts": parts}).encode())["results"]
    return results, [q["sql"] for q in queries]


def reads_answers(statements: list[str]) -> bool:
    return any('"breakers_commandack"."result"' in sql for sql in statements)


@pytest.mark.parametrize("earlier", [5, 50])
def test_a_waiting_acks_statements_are_the_same_whatever_the_acks_before_it(job, earlier):
    command = pause(job)
    answered_before(command, range(earlier))
    with CaptureQueriesContext(connection) as queries:
        answered = acknowledge_command(
            job.pk, command.pk, status="succeeded", result={"step": STEP, "rank": 60}, rank=60
        )
    statements = [q["sql"] for q in queries]
    assert answered.status in (CommandStatus.PENDING, CommandStatus.DELIVERED)
    assert len(statements) == WAITING_ACK_STATEMENTS, statements
    assert not reads_answers(statements)  # the others' answers are counted, not read


@pytest.mark.parametrize("earlier", [5, 50])
def test_a_nodes_acks_are_recorded_together_whatever_the_acks_before_them(job, earlier):
    command = pause(job)
    answered_before(command, range(earlier))
    results, statements = serve(job, [ack_part(command, rank) for rank in NODE])
    status = Command.objects.get(pk=command.pk).status
    assert results == [{"status": 200, "body": {"id": command.pk, "status": status}}] * 8
    assert status != CommandStatus.SUCCEEDED  # waiting for the ranks between
    assert len(statements) == WAITING_BUNDLE_STATEMENTS, statements
    assert sum("FOR UPDATE" in sql for sql in statements) == 1  # the job's row, once
    assert sum(sql.startswith("INSERT") for sql in statements) == 1
    assert not reads_answers(statements)
    acked = CommandAck.objects.filter(command=command, rank__in=NODE)
    assert sorted(acked.values_list("rank", flat=True)) == list(NODE)


def test_a_retried_bundle_of_acks_changes_nothing(job):
    command = pause(job)
    parts = [ack_part(command, rank) for rank in NODE]
    first, _ = serve(job, parts)
    stored = list(CommandAck.objects.filter(command=command).values_list("rank", "acknowledged_at"))
    again, _ = serve(job, parts)
    assert again == first and len(stored) == 8
    assert (
        list(CommandAck.objects.filter(command=command).values_list("rank", "acknowledged_at"))
        == stored
    )


def test_a_refused_part_writes_nothing_and_the_others_still_count(job):
    command = pause(job)
    answered_before(command, range(56))
    parts = [ack_part(command, rank) for rank in NODE[:-1]]
    parts += [ack_part(command, WORLD), {"path": parts[0]["path"], "body": '{"status": "ok"}'}]
    parts += [ack_part(command, NODE[-1])]
    results, _ = serve(job, parts)
    assert [r["status"] for r in results] == [200] * 7 + [400, 400, 200]
    assert "result.rank" in results[7]["body"]["fields"]
    assert "status" in results[8]["body"]["fields"]
    assert {r["body"]["status"] for r in results if r["status"] == 200} == {"succeeded"}
    assert not CommandAck.objects.filter(command=command, rank=WORLD).exists()
    assert CommandAck.objects.filter(command=command).count() == WORLD
    assert Job.objects.get(pk=job.pk).status == JobStatus.PAUSED


def test_acks_of_another_jobs_command_are_each_refused_as_not_found(job, make_agent):
    other = pause(Job.objects.get(pk=make_agent().job_id))
    results, _ = serve(job, [ack_part(other, rank) for rank in NODE[:2]])
    assert [r["status"] for r in results] == [404, 404]
    assert not CommandAck.objects.filter(command=other).exists()


def test_the_last_nodes_acks_at_the_same_step_succeed_the_command_and_pause_the_job(job):
    command = pause(job)
    answered_before(command, range(56))
    results, _ = serve(job, [ack_part(command, rank) for rank in NODE])
    assert {r["body"]["status"] for r in results} == {"succeeded"}
    command.refresh_from_db()
    assert command.result["step"] == STEP and len(command.result["ranks"]) == WORLD
    assert command.result["ranks"]["63"] == {"status": "succeeded", "step": STEP}
    assert Job.objects.get(pk=job.pk).status == JobStatus.PAUSED


def test_a_rank_of_the_bundle_that_failed_fails_the_command_naming_it(job):
    command = pause(job)
    answered_before(command, range(8))
    failed = ack_part(command, 60) | {
        "body": json.dumps({"status": "failed", "result": {"rank": 60}, "error": "disk full"})
    }
    results, _ = serve(job, [ack_part(command, 59), failed, ack_part(command, 61)])
    assert {r["body"]["status"] for r in results} == {"failed"}
    command.refresh_from_db()
    assert command.status == CommandStatus.FAILED and command.error == "rank 60: disk full"
    assert Job.objects.get(pk=job.pk).status != JobStatus.PAUSED


def test_a_node_at_another_step_is_a_split_alert_naming_its_ranks(job):
    command = pause(job)
    answered_before(command, range(8))
    results, _ = serve(job, [ack_part(command, rank, step=STEP + 1) for rank in NODE])
    assert {r["body"]["status"] for r in results} == {"failed"}
    command.refresh_from_db()
    assert "ranks 0, 1, 2, 3, 4, 5, 6, 7 at step 122" in command.error
    assert "ranks 56, 57, 58, 59, 60, 61, 62, 63 at step 123" in command.error
    alert = Alert.objects.get(job_id=job.pk, rule_key=RULE_KEY)
    assert "ranks 56, 57, 58" in alert.description and "node-7" in alert.nodes


@pytest.mark.parametrize("last_step", [STEP, STEP + 1])
def test_a_bundles_verdict_is_the_one_its_acks_one_at_a_time_make(job, last_step):
    """The same answers, a node's bundle at a time and one rank at a time: the same command.
    (The last rank decides: one at a time, the ranks after a deciding answer are not heard.)"""

    def step_of(rank: int) -> int:
        return last_step if rank == WORLD - 1 else STEP

    together = pause(job)
    for node in range(8):
        ranks = range(node * 8, node * 8 + 8)
        serve(job, [ack_part(together, rank, step_of(rank)) for rank in ranks])
    together.refresh_from_db()
    Job.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
    Alert.objects.filter(job_id=job.pk).update(status="resolved")
    alone = pause(job)
    for rank in range(WORLD):
        result = {"step": step_of(rank), "rank": rank}
        acknowledge_command(job.pk, alone.pk, status="succeeded", result=result, rank=rank)
    alone.refresh_from_db()
    assert together.status == alone.status
    assert (together.result, together.error) == (alone.result, alone.error)
