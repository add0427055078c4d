"""A training loop that never calls step_boundary is said loudly, long before an executor acts:
metrics keep moving the job's step while a delivered command waits (breakers.control.unapplied)."""

from __future__ import annotations

import pytest

from breakers.control.acknowledge import acknowledge_command
from breakers.control.commands import issue_command
from breakers.control.unapplied import UNAPPLIED_STEPS, flag_unapplied_commands
from breakers.models import Command
from incidents.models import Alert, Job

pytestmark = pytest.mark.django_db

HEARTBEAT = "/api/v1/agent/heartbeat"
METRICS = "/api/v1/agent/metrics"


def loss_at(step: int) -> dict:
    return {"points": [{"name": "loss", "step": step, "value": 1.0}]}


def test_metrics_past_an_unapplied_command_raise_a_step_boundary_alert(agent, agent_post):
    agent_post(HEARTBEAT, {"step": 100, "status": "running"})
    agent_post(METRICS, loss_at(100))
    command = issue_command(agent.job_id, "lower_lr", reason="loss rising", severity="L2").command
    agent_post(HEARTBEAT, {"step": 100, "status": "running"})  # the reply delivers it
    assert Command.objects.get(pk=command.pk).delivered_step == 100

    agent_post(METRICS, loss_at(100 + UNAPPLIED_STEPS - 1))
    assert flag_unapplied_commands() == 0  # not yet: a few steps is normal
    agent_post(METRICS, loss_at(100 + UNAPPLIED_STEPS))
    assert flag_unapplied_commands() == 1
    assert flag_unapplied_commands() == 0  # once, not every second
    alert = Alert.objects.get(job_id=agent.job_id, rule_key="commands-not-applied")
    assert alert.severity == "L2" and alert.action == "none"
    assert "is run.step_boundary(step) called" in alert.description
    assert Job.objects.get(pk=agent.job_id).status == "running"  # nothing stopped

    acknowledge_command(agent.job_id, command.pk, status="succeeded", result={"step": 151})
    alert.refresh_from_db()
    assert alert.status == "resolved"
