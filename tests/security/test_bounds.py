"""One job at step 2**63-1 broke two periodic duties for every team: the unapplied-command
check (``delivered_step + 50`` out of bigint range) and the roll-up (one loop over all jobs).

Now every step an agent sends is at most 2**53 (a 400 naming the field beyond), and each duty
does each job's part on its own: rows written before the bound (or by any other way) cost
that job its part, counted on /metrics, never the other teams'.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.utils import timezone

from breakers.agent.protocol import PointIn
from breakers.agent.store import store_points
from breakers.control.commands import issue_command
from breakers.control.duties import failures
from breakers.control.unapplied import UNAPPLIED_STEPS, flag_unapplied_commands
from breakers.models import Command
from breakers.storage import rollups
from incidents.models import Alert, Job

# Each test runs through the lean route and through the DRF views (tests/support/agent_doors.py).
BOTH_AGENT_DOORS = True

pytestmark = pytest.mark.django_db
HUGE = 2**63 - 1
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        ("/api/v1/agent/heartbeat", {"step": HUGE, "status": "running"}, "step"),
        (
            "/api/v1/agent/metrics",
            {"points": [{"name": "loss", "step": HUGE, "value": 1}]},
            "points[0].step",
        ),
        (
            "/api/v1/agent/checkpoints",
            {"path": "/c/1.pt", "sha256": "a" * 64, "step": HUGE},
            "step",
        ),
    ],
)
def test_a_step_beyond_2_to_the_53_is_a_400_naming_the_field(agent_post, url, body, field):
    answer = agent_post(url, body)
    assert answer.status_code == 400 and field in answer.json()["fields"], answer.content


def _delivered(job_id: int, delivered_step: int, current_step: int) -> Command:
    command = issue_command(job_id, "checkpoint_and_pause", reason="x", severity="L3").command
    Command.objects.filter(pk=command.pk).update(
        status="delivered", delivered_step=delivered_step, delivered_at=timezone.now()
    )
    Job.objects.filter(pk=job_id).update(current_step=current_step, status="running")
    return command


def test_a_job_at_the_largest_bigint_never_stops_the_unapplied_check_for_others(make_agent):
    bad = make_agent(team="team-x", name="huge")
    good = make_agent(team="team-y", name="ordinary")
    _delivered(bad.job_id, HUGE - 10, HUGE)  # a row from before the bound
    _delivered(good.job_id, 100, 100 + UNAPPLIED_STEPS)
    flag_unapplied_commands()
    assert Alert.objects.filter(job_id=good.job_id, rule_key="commands-not-applied").exists()


def test_one_job_whose_points_cannot_be_rolled_up_never_stops_the_others(make_agent):
    bad = make_agent(team="team-x", name="huge")
    good = make_agent(team="team-y", name="ordinary")
    store_points(bad.job_id, [PointIn("loss", HUGE, 1.0, T0, None, 0)])
    points = [PointIn("loss", step, 1.0, T0, None, 0) for step in range(10)]
    store_points(good.job_id, points)
    before = failures().get("roll_up", 0)
    merged = rollups.roll_up_all()
    assert merged.get(good.job_id) == len(points)
    assert bad.job_id not in merged
    assert failures()["roll_up"] == before + 1


def test_the_failures_are_on_the_metrics_endpoint(client, make_agent, settings):
    from breakers.control.duties import count_failure

    count_failure("roll_up")
    settings.METRICS_TOKEN = "metrics-token-for-tests"
    answer = client.get("/metrics", headers={"Authorization": "Bearer metrics-token-for-tests"})
    assert answer.status_code == 200
    assert 'brakeline_duty_failures_total{duty="roll_up"}' in answer.content.decode()
