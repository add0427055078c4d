"""Shadow mode on a live job: a shadow rule records what it would have done — level, action,
step, rank — and does nothing (no alert, no incident, no command, no page), while a live rule
on the same series acts as it always did; one record per episode, never one per point."""

from __future__ import annotations

import pytest

from breakers.agent.protocol import PointIn
from breakers.agent.store import store_points
from breakers.detection import rulesets, shadow
from breakers.detection.evaluation import evaluate_job
from breakers.detection.rules import install_default_pack
from breakers.models import Command, ShadowFiring
from core.errors import Conflict, Forbidden
from incidents.models import Alert, Delivery, Incident, Job
from tests.support.authz import make_scene

pytestmark = pytest.mark.django_db

LIVE_NAN_RULE = "non-finite-loss-or-gradients"
SHADOW_RULE = {
    "name": "NaN loss, observed",
    "layer": "stability",
    "metric": "loss",
    "detector": "non_finite",
    "severity": "L3",
    "action": "checkpoint_and_pause",
    "clear_after": 3,
    "shadow": True,
}


def healthy(start: int, stop: int, rank: int = 0) -> list[PointIn]:
    return [PointIn("loss", s, 2.0 + (s % 7) * 0.01, None, None, rank) for s in range(start, stop)]


def nan(step: int, rank: int = 0) -> PointIn:
    return PointIn("loss", step, float("nan"), None, None, rank)


@pytest.fixture
def scene():
    install_default_pack()
    scene = make_scene()
    rulesets.change_rules(
        scene.person("admin"),
        scene.team.pk,
        "see what it would do before it brakes anything",
        [{"op": "create", "key": "loss-nan-observed", "fields": SHADOW_RULE}],
    )
    return scene


def nothing_done(job_id: int) -> None:
    assert not Alert.objects.filter(job_id=job_id).exists()
    assert not Incident.objects.filter(job_id=job_id).exists()
    assert not Command.objects.filter(job_id=job_id).exists()
    assert not Delivery.objects.filter(alert__job_id=job_id).exists()


def test_a_shadow_rule_records_what_it_would_have_done_and_does_nothing(scene):
    rulesets.change_rules(
        scene.person("admin"),
        scene.team.pk,
        "only the shadow",
        [{"op": "disable", "key": LIVE_NAN_RULE}],
    )
    store_points(scene.job_id, [*healthy(0, 60), nan(60), nan(61, rank=1), nan(62)])
    evaluate_job(scene.job_id)
    evaluate_job(scene.job_id)  # a redelivered task records nothing new
    firing = ShadowFiring.objects.get(job_id=scene.job_id)
    assert (firing.rule_key, firing.severity, firing.action) == (
        "loss-nan-observed",
        "L3",
        "checkpoint_and_pause",
    )
    assert (firing.first_step, firing.fired_step, firing.last_step) == (60, 60, 61)
    assert firing.ranks == [0, 1] and firing.findings == 2 and firing.cleared_at is None
    nothing_done(scene.job_id)
    assert Job.objects.get(pk=scene.job_id).status == "running"


def test_a_live_rule_on_the_same_series_still_brakes(scene):
    store_points(scene.job_id, [*healthy(0, 60), nan(60)])
    evaluate_job(scene.job_id)
    alert = Alert.objects.get(job_id=scene.job_id)
    assert alert.rule_key == LIVE_NAN_RULE and alert.severity == "L3"
    assert Command.objects.filter(job_id=scene.job_id, kind="checkpoint_and_pause").count() == 1
    firing = ShadowFiring.objects.get(job_id=scene.job_id)
    assert firing.rule_key == "loss-nan-observed" and firing.fired_step == 60


def test_one_record_per_episode_closed_when_the_condition_clears(scene):
    rulesets.change_rules(
        scene.person("admin"),
        scene.team.pk,
        "only the shadow",
        [{"op": "disable", "key": LIVE_NAN_RULE}],
    )
    store_points(scene.job_id, [*healthy(0, 60), nan(60), *healthy(61, 70), nan(80)])
    evaluate_job(scene.job_id)
    first, second = ShadowFiring.objects.filter(job_id=scene.job_id).order_by("fired_step")
    assert first.cleared_step == 63 and first.cleared_at is not None
    assert second.fired_step == 80 and second.cleared_at is None
    nothing_done(scene.job_id)


def test_promoting_makes_the_rule_brake_and_is_a_version_of_its_own(scene):
    admin = scene.person("admin")
    rulesets.change_rules(
        admin, scene.team.pk, "only it", [{"op": "disable", "key": LIVE_NAN_RULE}]
    )
    store_points(scene.job_id, [*healthy(0, 60), nan(60)])
    evaluate_job(scene.job_id)
    with pytest.raises(Forbidden):
        shadow.promote_rule(scene.person("oncall"), scene.team.pk, "loss-nan-observed", "go")
    version = shadow.promote_rule(admin, scene.team.pk, "loss-nan-observed", "caught all 3")
    assert version.why == "caught all 3" and "loss-nan-observed" in version.summary
    with pytest.raises(Conflict):
        shadow.promote_rule(admin, scene.team.pk, "loss-nan-observed", "again")
    store_points(scene.job_id, [nan(61)])
    evaluate_job(scene.job_id)
    # The open shadow episode is closed as the rule goes live; its next anomaly brakes.
    assert ShadowFiring.objects.get(job_id=scene.job_id).cleared_reason == "the rule went live"
    store_points(scene.job_id, [nan(62)])
    evaluate_job(scene.job_id)
    assert Alert.objects.get(job_id=scene.job_id).rule_key == "loss-nan-observed"
    assert Command.objects.filter(job_id=scene.job_id).count() == 1
