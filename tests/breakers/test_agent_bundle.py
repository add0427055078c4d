"""POST /api/v1/agent/bundle (protocol 4): a node's ranks' requests in one. Each part is
answered as its own request would be, by the same service; the bundle's shape is refused whole
naming its field before anything is written; one rank's bad part refuses only that part."""

from __future__ import annotations

import json
import math

import pytest

from breakers.agent.bundle import MAX_BUNDLE_PARTS, bundle_reply, deliverable_to_ranks
from breakers.control.commands import issue_command
from breakers.models import Command, CommandAck, CommandKind, MetricBatch
from breakers.storage.points import stored_points
from incidents.models import Job, JobRank, JobStatus

URL = "/api/v1/agent/bundle"
pytestmark = pytest.mark.django_db
BOTH_AGENT_DOORS = True


def metrics(rank, value='"NaN"', step=7, batch=None, heartbeat=None):
    text = (
        f'{{"rank":{rank},"batch":"{batch or f"r{rank}-1"}","points":'
        f'[{{"name":"loss","step":{step},"value":{value}}}]'
    )
    if heartbeat is not None:
        text += ',"heartbeat":' + json.dumps(heartbeat)
    return {"path": "metrics", "body": text + "}"}


def heartbeat(rank, status="running", step=7):
    body = {"step": step, "status": status, "pid": 100 + rank, "hostname": "gpu-1", "rank": rank}
    return {"path": "heartbeat", "body": json.dumps(body | {"world_size": 4})}


def ranks(job_id):
    return {r.rank: (r.step, r.status) for r in JobRank.objects.filter(job_id=job_id)}


def test_each_part_is_answered_as_its_own_request_and_every_rank_kept_apart(agent, agent_post):
    parts = [metrics(0), metrics(1, value="Infinity"), heartbeat(2, "holding"), heartbeat(3)]
    response = agent_post(URL, {"parts": parts})
    assert response.status_code == 200, response.content
    assert response.headers["Brakeline-Protocol"] == "4"
    results = response.json()["results"]
    assert [r["status"] for r in results] == [202, 202, 200, 200]
    assert results[0]["body"] == {"accepted": 1, "commands": []}
    assert results[2]["body"] == {"commands": []}
    assert ranks(agent.job_id) == {2: (7, "holding"), 3: (7, "running")}
    values = {p.rank: p.value for p in stored_points(agent.job_id)}
    assert math.isnan(values[0]) and values[1] == math.inf  # non-finite values are data


def test_a_heartbeat_riding_in_a_part_is_its_ranks(agent, agent_post):
    beat = {"step": 9, "status": "running", "rank": 5, "world_size": 8}
    response = agent_post(URL, {"parts": [metrics(5, step=9, heartbeat=beat)]})
    assert response.json()["results"][0]["status"] == 202
    assert ranks(agent.job_id) == {5: (9, "running")}


def test_acks_of_two_ranks_in_one_bundle_answer_the_command(agent, agent_post):
    agent_post(URL, {"parts": [heartbeat(0), heartbeat(1)]})
    command = issue_command(
        agent.job_id, CommandKind.LOWER_LR, reason="test", params={"factor": 0.5}
    ).command
    ack = {"status": "succeeded", "result": {"rank": 0}}
    parts = [
        {"path": f"commands/{command.pk}/ack", "body": json.dumps(ack)},
        {"path": f"commands/{command.pk}/ack", "body": json.dumps(ack | {"result": {"rank": 1}})},
    ]
    results = agent_post(URL, {"parts": parts}).json()["results"]
    assert [r["status"] for r in results] == [200, 200]
    assert set(CommandAck.objects.filter(command=command).values_list("rank", flat=True)) == {0, 1}


def test_one_ranks_bad_part_refuses_that_part_only_naming_its_field(agent, agent_post):
    bad = metrics(1, value='"lots"')
    results = agent_post(URL, {"parts": [metrics(0), bad, heartbeat(2)]}).json()["results"]
    assert [r["status"] for r in results] == [202, 400, 200]
    assert "points[0].value" in results[1]["body"]["fields"], results[1]
    assert {p.rank for p in stored_points(agent.job_id)} == {0}  # nothing of rank 1's batch


def test_a_nodes_batches_are_stored_together_and_announced_once(agent, agent_post, monkeypatch):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from breakers.agent import service

    told = []
    monkeypatch.setattr(
        service, "publish_after_commit", lambda group, message, **_: told.append(message)
    )
    beats = [{"step": 7, "status": "running", "rank": r, "world_size": 8} for r in range(8)]
    agent_post(URL, {"parts": [heartbeat(r) for r in range(8)]})  # first words: new ranks
    parts = [metrics(r, value=str(r), heartbeat=beats[r]) for r in range(8)]
    with CaptureQueriesContext(connection) as queries:
        results = agent_post(URL, {"parts": parts}).json()["results"]
    assert [r["status"] for r in results] == [202] * 8
    assert sorted(p.rank for p in stored_points(agent.job_id)) == list(range(8))
    # One live message for the node's eight batches, and the commands owed asked once.
    assert [(m["type"], m["count"]) for m in told] == [("metrics.appended", 8)]
    asked = [
        q["sql"] for q in queries if q["sql"].startswith(f"SELECT 1 FROM {Command._meta.db_table} ")
    ]
    assert len(asked) == 1, asked


def test_a_part_refused_while_stored_leaves_nothing_of_its_own(agent, agent_post):
    agent_post(URL, {"parts": [heartbeat(0), heartbeat(1)]})
    Job.objects.filter(pk=agent.job_id).update(status=JobStatus.FINISHED)
    # Rank 1's batch carries the word of a process the finished job never had: a new run
    # under an old token, refused (409) with its batch; rank 0's batch is stored.
    stranger = {"step": 8, "status": "running", "rank": 1, "pid": 999, "world_size": 4}
    parts = [metrics(0, value="1.5"), metrics(1, value="2.5", heartbeat=stranger)]
    results = agent_post(URL, {"parts": parts}).json()["results"]
    assert [r["status"] for r in results] == [202, 409], results
    assert {p.rank for p in stored_points(agent.job_id)} == {0}
    assert not MetricBatch.objects.filter(job_id=agent.job_id, batch_id="r1-1").exists()
    assert ranks(agent.job_id)[1] == (7, "running")  # its old word stands


def test_a_part_refused_as_the_job_finishes_leaves_nothing_of_its_own(agent, agent_post):
    agent_post(URL, {"parts": [heartbeat(0), heartbeat(1)]})
    running = Job.objects.get(pk=agent.job_id)  # as the gate read it
    Job.objects.filter(pk=agent.job_id).update(status=JobStatus.FINISHED)  # then it finished
    # Served without savepoints (the job read as running): rank 1's refusal comes after its
    # batch id was claimed, so the bundle is served again, every part in a savepoint.
    stranger = {"step": 8, "status": "running", "rank": 1, "pid": 999, "world_size": 4}
    parts = [metrics(0, value="1.5"), metrics(1, value="2.5", heartbeat=stranger)]
    results = bundle_reply(running, json.dumps({"parts": parts}).encode())["results"]
    assert [r["status"] for r in results] == [202, 409], results
    assert {p.rank for p in stored_points(agent.job_id)} == {0}
    assert not MetricBatch.objects.filter(job_id=agent.job_id, batch_id="r1-1").exists()
    assert MetricBatch.objects.filter(job_id=agent.job_id, batch_id="r0-1").count() == 1


def test_a_batch_sent_twice_is_stored_once_in_one_bundle_and_across_bundles(agent, agent_post):
    parts = [metrics(0, value="1.5"), metrics(0, value="1.5"), metrics(1, value="2.5")]
    for _ in range(2):  # the bundle, then its retry
        results = agent_post(URL, {"parts": parts}).json()["results"]
        assert [(r["status"], r["body"]["accepted"]) for r in results] == [(202, 1)] * 3
    assert sorted(p.rank for p in stored_points(agent.job_id)) == [0, 1]
    assert MetricBatch.objects.filter(job_id=agent.job_id).count() == 2


def test_a_part_answers_404_for_another_jobs_command(agent, agent_post):
    part = {"path": "commands/999999/ack", "body": '{"status":"succeeded"}'}
    results = agent_post(URL, {"parts": [part, heartbeat(0)]}).json()["results"]
    assert [r["status"] for r in results] == [404, 200]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "body"),
        ({}, "parts"),
        ({"parts": []}, "parts"),
        ({"parts": {"path": "metrics"}}, "parts"),
        ({"parts": [heartbeat(0)] * (MAX_BUNDLE_PARTS + 1)}, "parts"),
        ({"parts": [heartbeat(0)], "node": "gpu-1"}, "node"),
        ({"parts": [heartbeat(0), "metrics"]}, "parts[1]"),
        ({"parts": [heartbeat(0), {"path": "snapshots", "body": "{}"}]}, "parts[1].path"),
        ({"parts": [{"path": "commands/x/ack", "body": "{}"}]}, "parts[0].path"),
        ({"parts": [{"path": "commands/" + "9" * 5000 + "/ack", "body": "{}"}]}, "parts[0].path"),
        ({"parts": [{"path": "../heartbeat", "body": "{}"}]}, "parts[0].path"),
        ({"parts": [{"path": "heartbeat", "body": {"step": 1}}]}, "parts[0].body"),
        ({"parts": [{"path": "heartbeat"}]}, "parts[0].body"),
        ({"parts": [{"path": "heartbeat", "body": "{}", "rank": 1}]}, "parts[0].rank"),
    ],
)
def test_a_bad_bundle_is_refused_whole_naming_its_field(agent, agent_post, body, field):
    response = agent_post(URL, body)
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"], response.json()
    assert not JobRank.objects.filter(job_id=agent.job_id).exists()
    assert not stored_points(agent.job_id)


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b'{"parts": [], "parts": []}', b'{"parts": NaN}', b"\xff\xfe"],
)
def test_malformed_json_is_a_400(agent_post, raw):
    response = agent_post(URL, raw)
    assert response.status_code == 400, response.content


def test_without_a_token_nothing_is_read(agent_post):
    response = agent_post(URL, {"parts": [heartbeat(0)]}, token="")
    assert response.status_code == 401


def test_a_nodes_catch_up_names_the_ranks_that_have_not_acknowledged(agent, agent_post):
    agent_post(URL, {"parts": [heartbeat(0), heartbeat(1)]})
    command = issue_command(
        agent.job_id, CommandKind.LOWER_LR, reason="test", params={"factor": 0.5}
    ).command
    ack = {
        "path": f"commands/{command.pk}/ack",
        "body": '{"status":"succeeded","result":{"rank":1}}',
    }
    agent_post(URL, {"parts": [ack]})
    assert [(c["id"], r) for c, r in deliverable_to_ranks(agent.job_id, [0, 1])] == [
        (command.pk, [0])
    ]
