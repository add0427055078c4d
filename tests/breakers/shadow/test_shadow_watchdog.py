"""The watchdog's rule (heartbeat-timeout) in shadow mode, through real HTTP heartbeats: a
silent job's silence is recorded as what the rule would have done (level, action, step) and
raises no alert, issues no command, pages nobody — even when every rank is silent in a
collective with another rule's brake waiting for them; heartbeats coming back close the
episode. Of the watchdog's rule a team changes its shadow mode and nothing else."""

from __future__ import annotations

import pytest
import time_machine
from django.utils import timezone

from breakers.control.commands import issue_command
from breakers.control.watchdog import watchdog_tick
from breakers.detection import rulesets, shadow
from breakers.detection.rules import install_default_pack
from breakers.detection.ruleset_core import WATCHDOG_RULES
from breakers.models import Command, ShadowFiring
from core.errors import InvalidInput
from incidents.models import Alert, Delivery, Incident, Job, JobStatus
from tests.support.authz import make_member, raise_alert

URL = "/api/v1/agent/heartbeat"
KEY = "heartbeat-timeout"
pytestmark = pytest.mark.django_db


def set_shadow(job_id: int, on: bool) -> None:
    team = Job.objects.get(pk=job_id).team
    rulesets.change_rules(
        make_member(team, "admin", prefix=f"admin{int(on)}"),
        team.pk,
        "see what the watchdog would do",
        [{"op": "update", "key": KEY, "fields": {"shadow": on}}],
    )


@pytest.fixture
def four_ranks(agent, agent_post):
    """Four ranks at 1 s per step heartbeating every 5 s, the watchdog's rule in shadow mode."""
    install_default_pack()
    set_shadow(agent.job_id, True)

    def beat(rank, step, sync_step=None):
        body = {"step": step, "status": "running", "rank": rank, "world_size": 4}
        body |= {"pid": 3000 + rank, "hostname": f"gpu-{rank}", "sync_step": sync_step or step}
        response = agent_post(URL, body)
        assert response.status_code == 200, response.content

    with time_machine.travel(timezone.now(), tick=False) as clock:
        for step in (0, 5, 10):
            for rank in range(4):
                beat(rank, step)
            clock.shift(5)
        yield agent, clock, beat


def hang(beat, clock) -> None:
    """Ranks 0, 1, 3 wait in step 12's sync that rank 2 never entered; all fall silent."""
    for rank in (0, 1, 3):
        beat(rank, 11, sync_step=12)
    beat(2, 11, sync_step=11)
    clock.shift(20)


def test_a_silent_job_under_a_shadow_watchdog_rule_records_and_does_nothing(four_ranks):
    agent, clock, beat = four_ranks
    hang(beat, clock)
    stopped: list[int] = []
    assert watchdog_tick(stopped.append) == [] and watchdog_tick(stopped.append) == []
    job = Job.objects.get(pk=agent.job_id)
    assert job.status == JobStatus.RUNNING and stopped == []
    assert not Alert.objects.filter(job=job).exists()
    assert not Incident.objects.filter(job=job).exists()
    assert not Command.objects.filter(job=job).exists()
    assert not Delivery.objects.filter(alert__job=job).exists()
    (firing,) = ShadowFiring.objects.filter(job=job)
    assert (firing.rule_key, firing.severity, firing.layer) == (KEY, "L3", "health")
    assert (firing.action, firing.fired_step, firing.node) == ("checkpoint_and_pause", 11, "")
    assert firing.findings == 1 and "rank 2 of 4 is hung" in firing.description
    declared = WATCHDOG_RULES[KEY]  # the rule set's row says what the watchdog does
    assert (declared["severity"], declared["action"]) == (firing.severity, firing.action)
    assert shadow.would_have_fired(job.pk)[0]["rule_key"] == KEY

    for rank in range(4):  # heard again: the episode closes at the next tick
        beat(rank, 13)
    watchdog_tick(stopped.append)
    firing.refresh_from_db()
    assert firing.cleared_reason == "heartbeats came back" and firing.cleared_step == 13


def test_another_rules_brake_is_not_hurried_by_a_shadow_watchdog(four_ranks):
    agent, clock, beat = four_ranks
    alert = raise_alert(agent.job_id, "L3")
    command = issue_command(agent.job_id, "checkpoint_and_pause", reason="L3", alert_id=alert.pk)
    deadline = command.command.deliver_by
    hang(beat, clock)
    stopped: list[int] = []
    assert watchdog_tick(stopped.append) == [] and stopped == []
    assert Command.objects.get(pk=command.command.pk).deliver_by == deadline
    assert not Alert.objects.filter(job_id=agent.job_id, rule_key=KEY).exists()
    assert ShadowFiring.objects.get(job_id=agent.job_id).rule_key == KEY


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"op": "update", "key": KEY, "fields": {"severity": "L1"}}, "changes[0].fields.severity"),
        ({"op": "disable", "key": KEY}, "changes[0].op"),
        ({"op": "delete", "key": KEY}, "changes[0].op"),
        (
            {
                "op": "create",
                "key": "my-watchdog",
                "fields": {"name": "x", "layer": "health", "metric": "m", "detector": "watchdog"},
            },
            "changes[0].fields.detector",
        ),
    ],
)
def test_of_the_watchdogs_rule_only_shadow_changes(scene, change, field):
    install_default_pack()
    with pytest.raises(InvalidInput) as refused:
        rulesets.change_rules(scene.person("admin"), scene.team.pk, "try", [change])
    assert field in refused.value.fields, refused.value.fields


def test_promoting_the_watchdogs_rule_leaves_no_row(scene):
    install_default_pack()
    admin = scene.person("admin")
    set_shadow(scene.job_id, True)
    assert rulesets.live_snapshot(scene.team.pk)["rules"][KEY]["shadow"] is True
    shadow.promote_rule(admin, scene.team.pk, KEY, "it would have caught the hang")
    assert KEY not in rulesets.live_snapshot(scene.team.pk)["rules"]


def test_promoted_during_a_silence_the_rule_alerts_at_the_next_tick(four_ranks):
    agent, clock, beat = four_ranks
    hang(beat, clock)
    watchdog_tick(lambda command_id: None)
    assert not Alert.objects.filter(job_id=agent.job_id).exists()
    set_shadow(agent.job_id, False)
    watchdog_tick(lambda command_id: None)
    (alert,) = Alert.objects.filter(job_id=agent.job_id, rule_key=KEY)
    assert alert.action == "checkpoint_and_pause"
    firing = ShadowFiring.objects.get(job_id=agent.job_id)
    assert firing.cleared_reason == "the rule went live"
