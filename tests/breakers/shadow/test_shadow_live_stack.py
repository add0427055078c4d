"""Shadow mode through the real stack: metrics posted over HTTP to Daphne, evaluated by a real
Celery worker on Redis + PostgreSQL. The live NaN rule brakes (its alert, its command pushed to
the agent); the shadow rule watching the same series records what it would have done and
raises nothing, commands nothing, pages nobody."""

from __future__ import annotations

import pytest

from breakers.detection import rulesets
from breakers.models import Command, ShadowFiring
from incidents.models import Alert, Delivery, Team
from tests.breakers.test_automatic_braking import HEALTHY, post
from tests.support.authz import make_member
from tests.support.waiting import wait_for
from tests.support.worker import worker_idle

SHADOW_RULE = {
    "name": "NaN loss, observed",
    "layer": "stability",
    "metric": "loss",
    "detector": "non_finite",
    "severity": "L4",
    "action": "terminate_and_isolate",
    "shadow": True,
}


@pytest.mark.django_db(transaction=True)
def test_the_shadow_rule_records_while_the_live_rule_brakes(live_console, worker, agent):
    team = Team.objects.get(jobs__pk=agent.job_id)
    rulesets.change_rules(
        make_member(team, "admin"),
        team.pk,
        "would an L4 have been right?",
        [{"op": "create", "key": "loss-nan-observed", "fields": SHADOW_RULE}],
    )
    points = [{"name": "loss", "step": p.step, "value": p.value} for p in HEALTHY]
    post(f"{live_console}/api/v1/agent/metrics", agent.token, {"points": points})
    nan = {"points": [{"name": "loss", "step": 60, "value": "NaN"}]}
    post(f"{live_console}/api/v1/agent/metrics", agent.token, nan)
    firing = wait_for(
        lambda: ShadowFiring.objects.filter(job_id=agent.job_id).first(), "the shadow record"
    )
    alert = wait_for(lambda: Alert.objects.filter(job_id=agent.job_id).first(), "the live alert")
    wait_for(worker_idle, "the worker to be idle")
    assert (firing.rule_key, firing.severity, firing.action, firing.fired_step) == (
        "loss-nan-observed",
        "L4",
        "terminate_and_isolate",
        60,
    )
    assert alert.rule_key == "non-finite-loss-or-gradients"
    assert list(Alert.objects.filter(job_id=agent.job_id).values_list("rule_key", flat=True)) == [
        "non-finite-loss-or-gradients"
    ]
    commands = Command.objects.filter(job_id=agent.job_id)
    assert [(c.kind, c.alert_id) for c in commands] == [("checkpoint_and_pause", alert.pk)]
    assert not Delivery.objects.filter(alert__rule_key="loss-nan-observed").exists()
