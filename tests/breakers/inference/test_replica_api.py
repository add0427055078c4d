"""Replica heartbeats: strict intake (a 400 naming the field, nothing written)."""

import pytest

from breakers.models import InferenceReplica

pytestmark = pytest.mark.django_db
GOOD = {"replica": "r1", "backend": "models", "pid": 4242, "hostname": "gpu-1", "healthy": True}


@pytest.fixture
def inference(make_agent):
    from breakers.models import InferenceServer

    agent = make_agent(name="api", kind="inference")
    InferenceServer.objects.create(job_id=agent.job_id, backend="models", server="r1")
    return agent


def post(client, agent, body):
    import json

    headers = {"Authorization": f"Bearer {agent.token}"}
    return client.post(
        "/api/v1/agent/replicas/heartbeat",
        json.dumps(body),
        content_type="application/json",
        headers=headers,
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"replica": "r1; shutdown"}, "replica"),
        ({"backend": ""}, "backend"),
        ({"pid": 1}, "pid"),
        ({"pid": "12"}, "pid"),
        ({"healthy": "yes"}, "healthy"),
        ({"healthy": None}, "healthy"),
        ({"detail": "x" * 501}, "detail"),
        ({"extra": 1}, "extra"),
    ],
)
def test_bad_fields_are_named_and_nothing_is_written(client, inference, change, field):
    body = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    answer = post(client, inference, body)
    assert answer.status_code == 400 and field in answer.json()["fields"]
    assert not InferenceReplica.objects.exists()


def test_a_training_job_has_no_replicas(client, agent):
    answer = post(client, agent, GOOD)
    assert answer.status_code == 400 and "inference jobs" in answer.json()["detail"]


def test_a_healthy_heartbeat_registers_the_replica(client, inference):
    answer = post(client, inference, GOOD)
    assert answer.status_code == 200
    assert answer.json() == {"replica": "r1", "status": "serving", "commands": []}
    replica = InferenceReplica.objects.get(job_id=inference.job_id)
    assert (replica.backend, replica.pid, replica.healthy) == ("models", 4242, True)
    # Not this host: no start time read, so the local executor would never signal it.
    assert replica.pid_start_time is None


def test_an_unhealthy_replica_in_traffic_raises_the_l3_and_leaves_traffic(client, inference):
    from incidents.models import Alert

    post(client, inference, GOOD)
    answer = post(client, inference, {**GOOD, "healthy": False, "detail": "3 NaN/Inf outputs"})
    assert answer.json()["status"] == "draining"
    alert = Alert.objects.get(job_id=inference.job_id)
    assert (alert.severity, alert.node, alert.rule_key) == (
        "L3",
        "r1",
        "inference-replica-unhealthy",
    )
    replica = InferenceReplica.objects.get(job_id=inference.job_id)
    assert replica.response_alert_id == alert.pk and replica.incident_id == alert.incident_id
    # Still unhealthy: the same alert, the same response (one at a time).
    post(client, inference, {**GOOD, "healthy": False, "detail": "4 NaN/Inf outputs"})
    assert Alert.objects.filter(job_id=inference.job_id).count() == 1
    from breakers.models import Command

    assert not Command.objects.filter(job_id=inference.job_id).exists()  # no checkpoint


def test_an_l3_naming_no_replica_is_a_timeline_note_not_a_pause(inference):
    from breakers.control.braking import brake_for_alert
    from breakers.models import Command
    from incidents.models import TimelineEntry
    from tests.support.authz import raise_alert

    alert = raise_alert(inference.job_id, "L3", rule_key="some-l3")
    assert brake_for_alert(alert) == []
    note = TimelineEntry.objects.filter(incident_id=alert.incident_id, kind="note").last()
    assert (
        note.message == "No automatic replica restart: no replica named '' heartbeats for this job"
    )
    assert not Command.objects.filter(job_id=inference.job_id).exists()


def test_one_worker_at_a_time_carries_out_the_response(client, inference, settings):
    from breakers.control.inference import _claim

    post(client, inference, GOOD)
    post(client, inference, {**GOOD, "healthy": False, "detail": "NaN"})
    replica = InferenceReplica.objects.get(job_id=inference.job_id)
    assert _claim(replica) and not _claim(replica)  # the second worker finds it claimed
    settings.INFERENCE_DRAIN_SECONDS = -10_000.0  # the lease has run out: a redelivery may
    assert _claim(replica)


def test_the_back_in_traffic_row_says_when_the_load_balancer_could_send_it_requests(
    client, inference, settings, haproxy
):
    """The row is stamped no later than the ``ready`` the load balancer acts on: a request it
    sends to the replica from then on never counts as answered while the replica was out."""
    from breakers.control.inference import reenable_if_healthy
    from incidents.models import TimelineEntry

    settings.HAPROXY_SOCKET = haproxy.address
    haproxy.stat_rows.append("models,r1,UP,0")
    post(client, inference, GOOD)
    post(client, inference, {**GOOD, "healthy": False, "detail": "NaN"})
    # Drained and restarted, as recover_replica leaves it; the new process is healthy.
    InferenceReplica.objects.filter(job_id=inference.job_id).update(
        status="restarting", pid=4343, healthy=True
    )
    assert reenable_if_healthy(InferenceReplica.objects.get(job_id=inference.job_id))
    back = TimelineEntry.objects.get(data__event="replica_back")
    assert back.at.timestamp() <= haproxy.received_at["set server models/r1 state ready"]
    assert "confirmed by the load balancer" in back.message
