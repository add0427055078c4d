"""Shadow mode beyond the engine's own evaluation: an Alertmanager (DCGM) alert routed to a job
under a rule in shadow mode is recorded as what it would have done and raises nothing, brakes
nothing, pages nobody; a shadow episode still open when its job ends is closed by the
watchdog's settling of ended jobs, once."""

from __future__ import annotations

import pytest

from breakers.control.settle import settle_final_jobs
from breakers.detection import rulesets
from breakers.detection.rules import install_default_pack
from breakers.models import Command, ExternalAlert, IntegrationToken, NodeBinding, ShadowFiring
from incidents.jobs import create_job
from incidents.models import Alert, Delivery, Incident, Job, Node, Team
from tests.breakers.monitoring.test_alertmanager_receiver import alert, post, webhook
from tests.support.authz import make_member

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(db):
    """Team research: job-a on gpu-a, job-b on gpu-b (running, bound by the operator's
    inventory), its fatal-XID rule in shadow mode, an integration token."""
    install_default_pack()
    jobs = {}
    for name, node in (("job-a", "gpu-a"), ("job-b", "gpu-b")):
        job = create_job("research", name).job
        Job.objects.filter(pk=job.pk).update(status="running", current_step=1200)
        Node.objects.create(job=job, hostname=node)
        NodeBinding.objects.create(job=job, hostname=node, source="operator")
        jobs[node] = job
    team = Team.objects.get(name="research")
    rulesets.change_rules(
        make_member(team, "admin"),
        team.pk,
        "watch fatal XIDs before they stop anything",
        [{"op": "update", "key": "dcgm-xid-fatal", "fields": {"shadow": True}}],
    )
    return team, jobs, IntegrationToken.issue(team, "alertmanager")[1]


def nothing_done(job: Job) -> None:
    assert not Alert.objects.filter(job=job).exists()
    assert not Incident.objects.filter(job=job).exists()
    assert not Command.objects.filter(job=job).exists()
    assert not Delivery.objects.filter(alert__job=job).exists()


def test_a_shadow_dcgm_rule_records_the_alertmanager_alert_and_does_not_brake(client, cluster):
    _, jobs, token = cluster
    job_b = jobs["gpu-b"]
    response = post(client, token, webhook([alert("gpu-b", gpu) for gpu in range(2)]))
    assert response.status_code == 200, response.content
    assert response.json()["shadow"] == 2 and response.json()["alert_ids"] == []
    nothing_done(job_b)
    (firing,) = ShadowFiring.objects.filter(job=job_b)
    assert (firing.rule_key, firing.severity, firing.node) == ("dcgm-xid-fatal", "L4", "gpu-b")
    assert firing.action == "terminate_and_isolate" and firing.fired_step == 1200
    assert firing.findings == 2 and firing.cleared_at is None
    assert set(ExternalAlert.objects.values_list("job_id", flat=True)) == {job_b.pk}

    # The rule's live neighbour (a non-fatal XID) acts as always, on the other node.
    post(client, token, webhook([alert("gpu-a", 0, xid="13")]))
    (live,) = Alert.objects.filter(job=jobs["gpu-a"])
    assert (live.rule_key, live.severity) == ("alertmanager:DCGMXidError", "L2")

    # Resolved: the episode closes with the last firing alert of its rule on the node.
    post(client, token, webhook([alert("gpu-b", 0, status="resolved")], "resolved"))
    assert ShadowFiring.objects.get(pk=firing.pk).cleared_at is None
    post(client, token, webhook([alert("gpu-b", 1, status="resolved")], "resolved"))
    firing.refresh_from_db()
    assert firing.cleared_at is not None and "resolved" in firing.cleared_reason
    nothing_done(job_b)


def test_an_open_shadow_episode_closes_when_its_job_ends_once(client, cluster):
    _, jobs, token = cluster
    post(client, token, webhook([alert("gpu-b", 0)]))
    (firing,) = ShadowFiring.objects.filter(job=jobs["gpu-b"], cleared_at__isnull=True)
    settle_final_jobs()
    assert ShadowFiring.objects.get(pk=firing.pk).cleared_at is None  # still running
    Job.objects.filter(pk=jobs["gpu-b"].pk).update(status="finished", current_step=1500)
    settle_final_jobs()
    firing.refresh_from_db()
    assert firing.cleared_at is not None and firing.cleared_step == 1500
    assert firing.cleared_reason.startswith("the job is finished")
    closed_at = firing.cleared_at
    settle_final_jobs()
    assert ShadowFiring.objects.get(pk=firing.pk).cleared_at == closed_at
