"""Automatic braking: an alert's rule action becomes commands at once, exactly once.

The last test is the product's loop end to end against the real services: a NaN posted over
HTTP to Daphne, evaluated by a real Celery worker on Redis + PostgreSQL, braked with
checkpoint_and_pause pushed to the agent's websocket, acknowledged, the job paused and the
incident timeline complete and in order.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from websockets.sync.client import connect

from breakers.agent.protocol import PointIn
from breakers.agent.store import store_points
from breakers.detection.evaluation import evaluate_job
from breakers.detection.rules import install_default_pack
from breakers.models import Command, CommandKind
from incidents.models import Alert, Incident, Job, JobStatus, TimelineEntry
from tests.support.waiting import wait_for

HEALTHY = [PointIn("loss", step, 2.0 + (step % 7) * 0.01, None, None) for step in range(60)]


@pytest.mark.django_db
def test_a_nan_loss_issues_checkpoint_and_pause_once(agent):
    install_default_pack()
    store_points(agent.job_id, [*HEALTHY, PointIn("loss", 60, float("nan"), None, None)])
    evaluate_job(agent.job_id)
    evaluate_job(agent.job_id)  # a redelivered task: nothing new
    alert = Alert.objects.get(job_id=agent.job_id, severity="L3")
    command = Command.objects.get(job_id=agent.job_id)
    assert command.kind == CommandKind.CHECKPOINT_AND_PAUSE and command.alert_id == alert.pk
    assert command.issued_by_kind == "system" and command.severity == "L3"
    assert "NaN" in command.reason or "nan" in command.reason.lower()
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSING
    kinds = list(
        TimelineEntry.objects.filter(incident=alert.incident).values_list("kind", flat=True)
    )
    assert kinds.index("alert_raised") < kinds.index("command_issued")


@pytest.mark.django_db
def test_two_failing_nodes_terminate_and_isolate_each(agent):
    install_default_pack()
    store_points(
        agent.job_id,
        [
            PointIn("node.failure", 10, 1.0, None, "node-03"),
            PointIn("node.failure", 10, 1.0, None, "node-07"),
        ],
    )
    evaluate_job(agent.job_id)
    commands = Command.objects.filter(job_id=agent.job_id).order_by("pk")
    assert [(c.kind, c.params.get("node")) for c in commands] == [
        ("terminate", None),
        ("isolate_node", "node-03"),
        ("isolate_node", "node-07"),
    ]
    assert {c.severity for c in commands} == {"L4"}


def post(url: str, token: str, body: dict) -> dict:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.django_db(transaction=True)
def test_nan_to_paused_through_the_real_stack(live_console, worker, agent):
    ws_url = live_console.replace("http://", "ws://") + "/ws/agent/"
    points = [{"name": "loss", "step": p.step, "value": p.value} for p in HEALTHY]
    with connect(ws_url, additional_headers=agent.headers) as socket:
        post(
            f"{live_console}/api/v1/agent/heartbeat", agent.token, {"step": 59, "status": "running"}
        )
        post(f"{live_console}/api/v1/agent/metrics", agent.token, {"points": points})
        post(
            f"{live_console}/api/v1/agent/metrics",
            agent.token,
            {"points": [{"name": "loss", "step": 60, "value": "NaN"}]},
        )
        message = json.loads(socket.recv(timeout=20))
    command = message["command"]
    assert message["type"] == "command" and command["kind"] == "checkpoint_and_pause"
    assert command["severity"] == "L3" and "step 60" in command["reason"]
    result = {
        "path": "/ckpt/step-60.pt",
        "bytes": 2048,
        "seconds": 0.3,
        "sha256": "00" * 32,
        "step": 60,
        "released": True,
    }
    post(
        f"{live_console}/api/v1/agent/commands/{command['id']}/ack",
        agent.token,
        {"status": "succeeded", "result": result},
    )
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED
    incident = Incident.objects.get(job_id=agent.job_id)
    assert incident.status == "mitigated" and incident.level == "L3"
    # The chain's rows; a new team's default policy adds its (failed: no address) deliveries'
    # rows whenever the worker gets to them, which this test is not about.
    chain = incident.timeline.exclude(kind__startswith="notification_")
    kinds = [
        e.kind
        for e in wait_for(lambda: list(chain.all()) if chain.count() >= 6 else None, "the timeline")
    ]
    assert kinds == [
        "first_anomalous_point",
        "alert_raised",
        "command_issued",
        "command_acknowledged",
        "checkpoint_saved",
        "resources_released",
    ]


@pytest.mark.django_db(transaction=True)
def test_without_a_websocket_the_brake_arrives_in_the_heartbeat_reply(live_console, worker, agent):
    post(
        f"{live_console}/api/v1/agent/metrics",
        agent.token,
        {"points": [{"name": "loss", "step": 1, "value": "NaN"}]},
    )

    def brake_in_reply():
        reply = post(
            f"{live_console}/api/v1/agent/heartbeat", agent.token, {"step": 1, "status": "running"}
        )
        return reply["commands"]

    commands = wait_for(brake_in_reply, "a command in a heartbeat reply")
    assert [c["kind"] for c in commands] == ["checkpoint_and_pause"]
    post(
        f"{live_console}/api/v1/agent/commands/{commands[0]['id']}/ack",
        agent.token,
        {"status": "succeeded", "result": {"path": "/c.pt", "bytes": 1, "step": 1}},
    )
    assert brake_in_reply() == []
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED


@pytest.mark.django_db(transaction=True)
def test_an_agent_that_stops_heartbeating_gets_the_alert(live_console, worker, agent):
    from breakers.control.tasks import watchdog

    Job.objects.filter(pk=agent.job_id).update(heartbeat_timeout_seconds=0.3)
    beat = {"step": 5, "status": "running"}
    post(f"{live_console}/api/v1/agent/heartbeat", agent.token, beat)
    time.sleep(0.4)  # the agent is silent past its deadline
    watchdog.delay()  # what beat sends every second
    alert = wait_for(
        lambda: Alert.objects.filter(job_id=agent.job_id, rule_key="heartbeat-timeout").first(),
        "the heartbeat alert",
    )
    assert alert.severity == "L3" and alert.status == "firing"
    assert Command.objects.get(job_id=agent.job_id, alert=alert).kind == "checkpoint_and_pause"
    post(f"{live_console}/api/v1/agent/heartbeat", agent.token, beat)  # back to life
    alert.refresh_from_db()
    assert alert.status == "resolved"
