"""retire_job: a run known to be over though it never said so (the demo started again).

Seen from a second `make demo`: the first run's job stayed "paused" with its L3 alert firing
for ever, though its process was long gone.
"""

from __future__ import annotations

import pytest

from breakers.agent.points import PointIn
from breakers.agent.store import store_points
from breakers.control.acknowledge import acknowledge_command
from breakers.detection.evaluation import evaluate_job
from breakers.detection.rules import install_default_pack
from breakers.models import Command, CommandKind
from incidents.heartbeats import record_heartbeat
from incidents.jobs import retire_job
from incidents.models import Alert, Incident, Job, JobStatus, TimelineEntry

pytestmark = pytest.mark.django_db

WHY = "the demo was started again"


def _braked(job_id: int) -> None:
    install_default_pack()
    healthy = [PointIn("loss", s, 2.0, None, None, 0) for s in range(20)]
    store_points(job_id, [*healthy, PointIn("loss", 20, float("nan"), None, None, 0)])
    evaluate_job(job_id)
    pause = Command.objects.get(job_id=job_id, kind=CommandKind.CHECKPOINT_AND_PAUSE)
    acknowledge_command(job_id, pause.pk, status="succeeded", result={"step": 20})
    assert Job.objects.get(pk=job_id).status == JobStatus.PAUSED


def test_a_paused_run_with_its_alert_firing_is_terminated_and_its_incident_resolved(agent):
    _braked(agent.job_id)
    assert Alert.objects.filter(job_id=agent.job_id, status="firing").exists()
    assert retire_job(agent.job_id, WHY) is True
    job = Job.objects.get(pk=agent.job_id)
    assert job.status == JobStatus.TERMINATED and job.heartbeat_deadline is None
    assert not Alert.objects.filter(job_id=agent.job_id).exclude(status="resolved").exists()
    incident = Incident.objects.get(job_id=agent.job_id)
    assert incident.status == "resolved"
    rows = TimelineEntry.objects.filter(incident=incident).order_by("pk")
    kinds = list(rows.values_list("kind", "message"))
    assert ("terminated", f"Run over: {WHY}") in kinds
    assert kinds[-1][0] == "incident_resolved"


def test_a_finished_run_is_left_as_it_is(agent):
    record_heartbeat(agent.job_id, step=5, status="running")
    record_heartbeat(agent.job_id, step=6, status="finished")
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.FINISHED
    assert retire_job(agent.job_id, WHY) is False
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.FINISHED
    assert not TimelineEntry.objects.exists()
