"""The post-incident review tests' shared scene: a team with one person per role, a stranger,
and the product's real loop — NaN → L3 → checkpoint-and-pause → ack → resume — run through
the real services at fixed instants (time_machine), so every duration is known exactly.

The fixtures ``team`` and ``flow`` are plugins: name them as parameters (a module that defines
its own ``team`` fixture keeps it). The constants and helpers are imported by name.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth import get_user_model

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
# When each step of the flow happens, in seconds after T0 (the durations follow from these).
AT_NAN = 10  # the NaN point arrives (its time: the first anomalous point)
AT_ALERT = 13  # evaluated: the L3 alert is raised, checkpoint_and_pause issued by the system
AT_ACK_ALERT = 15  # the on-call engineer acknowledges the alert
AT_CHECKPOINT = 21  # the agent confirms the checkpoint (step 62): training stopped
AT_RESUME_ISSUED = 100  # a manager resumes the job
AT_RESUMED = 103  # the agent confirms the resume
AT_HEALTHY = 110  # healthy points again: the alert, then the incident, resolve
NAN_STEP, CHECKPOINT_STEP = 60, 62
NODES, GPUS_PER_NODE = 4, 8

_names = itertools.count(1)


@dataclass
class Team:
    team: Any
    job_id: int
    people: dict[str | None, Any] = field(default_factory=dict)

    def person(self, role: str | None) -> Any:
        """The member with ``role``; None: an admin of another team (a stranger here)."""
        from incidents.models import Membership
        from incidents.models import Team as TeamModel

        if role not in self.people:
            user = get_user_model().objects.create(username=f"{role or 'stranger'}-{next(_names)}")
            team = self.team if role else TeamModel.objects.get_or_create(name="elsewhere")[0]
            Membership.objects.create(user=user, team=team, role=role or "admin")
            self.people[role] = user
        return self.people[role]


@pytest.fixture
def team(db) -> Team:
    from incidents.jobs import create_job
    from incidents.models import NotificationPolicy

    created = create_job("research", f"llm-{next(_names)}")
    # No paging: the review's timeline holds the chain's rows alone, whether or not a worker
    # happens to run the dispatch (a new team's default policy would add failed deliveries).
    NotificationPolicy.objects.filter(team=created.job.team).delete()
    return Team(team=created.job.team, job_id=created.job.pk)


@dataclass
class Flow:
    team: Team
    incident_id: int
    alert_id: int
    pause_id: int
    resume_id: int


def healthy(steps: range) -> list:
    """A loss settling from 2.6 towards 2.0 with a little noise: no rule of the pack fires."""
    from breakers.agent.protocol import PointIn

    return [
        PointIn("loss", step, 2.0 + 0.6 * math.exp(-step / 30) + 0.004 * (step * 7 % 5), None, None)
        for step in steps
    ]


def run_flow(team: Team, *, roll_back: dict[str, Any] | None = None) -> Flow:
    """The complete loop through the real services, each step at its fixed instant.
    ``roll_back``: the catalogue checkpoint (path, step, sha256) the resume rolls back to."""
    from breakers.agent.protocol import PointIn
    from breakers.agent.store import store_points
    from breakers.control.acknowledge import acknowledge_command
    from breakers.control.commands import issue_command
    from breakers.detection.evaluation import evaluate_job
    from breakers.detection.rules import install_default_pack
    from breakers.models import Command
    from incidents.alerts.acknowledge import acknowledge_alert
    from incidents.job_size import declare_job_size
    from incidents.models import Alert

    job_id = team.job_id
    install_default_pack()
    declare_job_size(job_id, nodes=NODES, gpus_per_node=GPUS_PER_NODE, accelerator="H100")
    with time_machine.travel(T0, tick=False) as clock:
        store_points(job_id, healthy(range(NAN_STEP)))
        evaluate_job(job_id)
        clock.move_to(T0 + timedelta(seconds=AT_NAN))
        store_points(job_id, [PointIn("loss", NAN_STEP, math.nan, None, None)])
        clock.move_to(T0 + timedelta(seconds=AT_ALERT))
        evaluate_job(job_id)
        alert = Alert.objects.get(job_id=job_id, severity="L3")
        pause = Command.objects.get(job_id=job_id, kind="checkpoint_and_pause")
        clock.move_to(T0 + timedelta(seconds=AT_ACK_ALERT))
        acknowledge_alert(team.person("oncall"), alert.pk, note="looking")
        clock.move_to(T0 + timedelta(seconds=AT_CHECKPOINT))
        result = {
            "path": "/ckpt/step-62.pt",
            "bytes": 7_340_032,
            "seconds": 2.5,
            "sha256": "ab" * 32,
            "step": CHECKPOINT_STEP,
            "released": True,
        }
        acknowledge_command(job_id, pause.pk, status="succeeded", result=result)
        clock.move_to(T0 + timedelta(seconds=AT_RESUME_ISSUED))
        manager = team.person("manager")
        params, resumed = {}, {"step": 62}
        if roll_back is not None:
            params = {"checkpoint": roll_back["path"], **roll_back}
            restored = {"restored_step": roll_back["step"], "sha256": roll_back["sha256"]}
            resumed = {"rolled_back": True, "step": roll_back["step"], **restored}
        resume = issue_command(
            job_id,
            "resume",
            reason="NaN traced to one bad batch",
            actor_kind="person",
            actor=manager,
            params=params,
        ).command
        clock.move_to(T0 + timedelta(seconds=AT_RESUMED))
        acknowledge_command(job_id, resume.pk, status="succeeded", result=resumed)
        clock.move_to(T0 + timedelta(seconds=AT_HEALTHY))
        store_points(job_id, healthy(range(CHECKPOINT_STEP + 1, CHECKPOINT_STEP + 20)))
        evaluate_job(job_id)
    return Flow(team, alert.incident_id, alert.pk, pause.pk, resume.pk)


@pytest.fixture
def flow(team) -> Flow:
    return run_flow(team)


def raise_alert(job_id: int, severity: str, *, at: datetime = T0, rule_key: str = "test-rule"):
    """A stability alert on the job, opening (or joining) its incident at ``at``."""
    from incidents.alerts.lifecycle import AlertSignal, raise_or_update_alert

    signal = AlertSignal(
        rule_key=rule_key,
        rule_name=f"Test rule {severity}",
        layer="stability",
        severity=severity,
        metric="loss",
        node="",
        value=9.5,
        threshold=4.0,
        description=f"loss 9.5 above 4.0 ({severity})",
        step=100,
        time=at,
        first_step=90,
        first_time=at - timedelta(seconds=10),
    )
    return raise_or_update_alert(job_id, signal, now=at).alert
