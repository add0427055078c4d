"""The Alertmanager receiver against PostgreSQL: routing, one incident per node, brakes through
the breakers' own services, repeats, resolution, the unrouted list, hostile bodies."""

from __future__ import annotations

import json

import pytest

from breakers.control.acknowledge import acknowledge_command
from breakers.models import Command, ExternalAlert, IntegrationToken, NodeBinding
from incidents.jobs import create_job
from incidents.models import Alert, Incident, Job, Node, Team
from tests.support.authz import Api, make_member

URL = "/api/v1/integrations/alertmanager"
pytestmark = pytest.mark.django_db


def alert(node: str, gpu: int, *, status="firing", xid="79", **labels) -> dict:
    return {
        "status": status,
        "labels": {
            "alertname": "DCGMXidError",
            "Hostname": node,
            "gpu": str(gpu),
            "instance": "127.0.0.1:9400",
            "brakeline_signal": "dcgm-xid",
            "xid": xid,
            **labels,
        },
        "annotations": {"summary": f"XID {xid} on {node} GPU {gpu}", "value": xid},
        "startsAt": "2026-12-02T01:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-12-02T01:05:00Z",
        "generatorURL": "http://prometheus.invalid/graph",
        "fingerprint": f"{abs(hash((node, gpu, xid, tuple(labels.items())))):016x}",
    }


def webhook(alerts: list[dict], status: str = "firing") -> dict:
    return {
        "version": "4",
        "groupKey": '{}:{alertname="DCGMXidError"}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "brakeline",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.invalid",
        "alerts": alerts,
    }


@pytest.fixture
def cluster(db):
    """Team research: job-a on gpu-a, job-b on gpu-b (running, bound there by the operator's
    node inventory); an integration token."""
    jobs = {}
    for name, node in (("job-a", "gpu-a"), ("job-b", "gpu-b")):
        job = create_job("research", name).job
        Job.objects.filter(pk=job.pk).update(status="running", current_step=1200)
        Node.objects.create(job=job, hostname=node)
        NodeBinding.objects.create(job=job, hostname=node, source="operator")
        jobs[node] = job
    team = Team.objects.get(name="research")
    return team, jobs, IntegrationToken.issue(team, "alertmanager")[1]


def post(client, token, body, content_type="application/json"):
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return client.post(URL, data=data, content_type=content_type, headers=headers)


def test_eight_gpu_alerts_of_node_b_brake_the_job_on_node_b_only(client, cluster):
    team, jobs, token = cluster
    eight = [alert("gpu-b", gpu) for gpu in range(8)]
    response = post(client, token, webhook(eight))
    assert response.status_code == 200, response.content
    assert response.json()["new"] == 8 and response.json()["unrouted"] == 0
    job_b, job_a = jobs["gpu-b"], jobs["gpu-a"]
    (brakeline_alert,) = Alert.objects.filter(job=job_b)
    assert (brakeline_alert.severity, brakeline_alert.layer) == ("L4", "health")
    assert brakeline_alert.node == "gpu-b" and brakeline_alert.action == "terminate_and_isolate"
    assert "XID 79" in brakeline_alert.description
    assert Incident.objects.filter(job=job_b).count() == 1
    assert ExternalAlert.objects.filter(alert=brakeline_alert).count() == 8
    commands = {(c.kind, c.params.get("node")) for c in Command.objects.filter(job=job_b)}
    assert commands == {("terminate", None), ("isolate_node", "gpu-b")}
    assert not Command.objects.filter(job=job_a).exists()
    assert not Alert.objects.filter(job=job_a).exists()

    # Alertmanager's repeats (repeat_interval, an HA pair) change nothing.
    again = post(client, token, webhook(eight)).json()
    assert (again["new"], again["repeated"]) == (0, 8)
    assert Command.objects.filter(job=job_b).count() == 2
    assert Alert.objects.filter(job=job_b).count() == 1

    # Seven GPUs recover: the alert stays; the eighth: alert and incident resolve.
    resolved = [alert("gpu-b", gpu, status="resolved") for gpu in range(8)]
    post(client, token, webhook(resolved[:7], status="resolved"))
    brakeline_alert.refresh_from_db()
    assert brakeline_alert.status == "firing"
    post(client, token, webhook(resolved[7:], status="resolved"))
    brakeline_alert.refresh_from_db()
    assert brakeline_alert.status == "resolved"
    # The brake was issued but not carried out yet: the episode (and incident) go on ...
    assert Incident.objects.get(job=job_b).status == "open"
    assert post(client, token, webhook(resolved, status="resolved")).json()["resolved"] == 0
    # ... until the job is terminated (incidents.alerts.episode).
    terminate = Command.objects.get(job=job_b, kind="terminate")
    acknowledge_command(job_b.pk, terminate.pk, status="succeeded", result={"step": 1})
    assert Incident.objects.get(job=job_b).status == "resolved"


def test_a_non_fatal_xid_warns_and_brakes_nothing(client, cluster):
    _, jobs, token = cluster
    post(client, token, webhook([alert("gpu-a", 0, xid="13")]))
    (warning,) = Alert.objects.filter(job=jobs["gpu-a"])
    assert (warning.severity, warning.action) == ("L2", "none")
    assert not Command.objects.exists()


def test_the_brakeline_job_label_routes_without_a_node(client, cluster):
    _, jobs, token = cluster
    labelled = alert("", 0, brakeline_job="job-a")
    labelled["labels"].pop("Hostname")
    labelled["labels"]["instance"] = "not a node[1-2]:x"
    post(client, token, webhook([labelled]))
    (routed,) = Alert.objects.filter(job=jobs["gpu-a"])
    assert routed.severity == "L4" and routed.node == ""
    assert [c.kind for c in Command.objects.filter(job=jobs["gpu-a"])] == ["terminate"]


def test_unrouted_alerts_are_kept_and_listed_for_the_team_only(client, cluster):
    team, jobs, token = cluster
    body = post(client, token, webhook([alert("gpu-z", 0), alert("", 1)])).json()
    assert body["unrouted"] == 2 and not Alert.objects.exists()
    member = Api(make_member(team, "viewer"))
    rows = member.get(f"{URL}/unrouted").json()
    assert {row["node"] for row in rows} == {"gpu-z", "127.0.0.1"}  # instance, port stripped
    assert any("no running job of the team on node gpu-z" in r["unrouted_reason"] for r in rows)
    stranger = Api(make_member(Team.objects.create(name="other"), "admin"))
    assert stranger.get(f"{URL}/unrouted").json() == []
    # The job starts on gpu-z: Alertmanager's next repeat routes the alert after all.
    Node.objects.create(job=jobs["gpu-a"], hostname="gpu-z")
    post(client, token, webhook([alert("gpu-z", 0)]))
    assert Alert.objects.get(job=jobs["gpu-a"]).node == "gpu-z"
    assert len(member.get(f"{URL}/unrouted").json()) == 1
    page = client.get("/monitoring/")
    assert page.status_code == 302  # a page for people: log in first
    client.force_login(member.user)
    html = client.get("/monitoring/").content.decode()
    assert "Unrouted" in html and "DCGMXidError" in html and "job-a" in html


def test_another_teams_token_never_reaches_this_teams_jobs(client, cluster):
    other = Team.objects.create(name="other")
    token = IntegrationToken.issue(other, "alertmanager")[1]
    assert post(client, token, webhook([alert("gpu-b", 0)])).json()["unrouted"] == 1
    assert not Alert.objects.exists() and not Command.objects.exists()


def test_tokens_are_required_known_and_unrevoked(client, cluster):
    team, _, token = cluster
    assert post(client, None, webhook([])).status_code == 401
    assert post(client, "bki_nope", webhook([])).status_code == 401
    IntegrationToken.objects.update(revoked_at="2026-01-01T00:00:00Z")
    assert post(client, token, webhook([])).json()["error"] == "revoked_token"


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"{", 400, "body"),
        (b"[" * 100_000, 400, "body"),
        (
            {"version": "4", "groupKey": "", "status": "firing", "alerts": [{}]},
            400,
            "alerts[0].status",
        ),
        ({**webhook([]), "version": "5"}, 400, "version"),
        ({**webhook([alert("gpu-b", 0)]), "status": "maybe"}, 400, "status"),
    ],
)
def test_hostile_bodies_are_400s_naming_the_field_and_write_nothing(
    client, cluster, body, status, field
):
    _, _, token = cluster
    response = post(client, token, body)
    assert response.status_code == status and field in response.json()["fields"]
    assert not ExternalAlert.objects.exists()


def test_a_half_bad_webhook_writes_nothing(client, cluster):
    _, _, token = cluster
    bad = alert("gpu-b", 1)
    bad["startsAt"] = "soon"
    response = post(client, token, webhook([alert("gpu-b", 0), bad]))
    assert response.json()["fields"] == {
        "alerts[1].startsAt": response.json()["fields"]["alerts[1].startsAt"]
    }
    assert not ExternalAlert.objects.exists() and not Command.objects.exists()


def test_not_json_is_415(client, cluster):
    _, _, token = cluster
    response = post(client, token, "version=4", content_type="text/plain")
    assert response.status_code == 415
