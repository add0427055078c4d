"""Rules as data: the default pack installed by migration, team overrides, admin editing."""

from __future__ import annotations

import importlib

import pytest
from django.core.exceptions import ValidationError

from breakers.detection.rulepack import DEFAULT_RULES, default_rules
from breakers.detection.rules import effective_rules
from breakers.models import Rule
from incidents.models import Team

pytestmark = pytest.mark.django_db


def by_key(rules):
    return {rule.key: rule for rule in rules}


def team_rule(team, key, **fields):
    """A team row copying the default rule ``key`` with ``fields`` changed."""
    row = Rule.objects.get(team=None, key=key)
    row.pk, row.team = None, team
    for name, value in fields.items():
        setattr(row, name, value)
    row.full_clean()
    row.save()
    return row


def test_the_migration_installed_the_default_pack_exactly():
    rows = Rule.objects.filter(team=None)
    assert sorted(rows.values_list("key", flat=True)) == sorted(r["key"] for r in DEFAULT_RULES)
    assert by_key(r.to_spec() for r in rows) == by_key(default_rules())
    assert not rows.filter(key="heartbeat-timeout").exists()


def test_a_team_without_overrides_gets_the_default_pack():
    team = Team.objects.create(name="plain")
    assert by_key(effective_rules(team.pk)) == by_key(default_rules())


def test_a_team_override_disables_a_rule_for_that_team_only():
    research, other = Team.objects.create(name="research"), Team.objects.create(name="other")
    team_rule(research, "loss-deviation", enabled=False)
    assert by_key(effective_rules(research.pk))["loss-deviation"].enabled is False
    assert by_key(effective_rules(other.pk))["loss-deviation"].enabled is True


def test_a_team_override_changes_a_rule_and_a_new_key_adds_one():
    team = Team.objects.create(name="research")
    team_rule(team, "loss-rising", params={"window": 20, "windows": 3, "min_rise_se": 2.0})
    Rule(
        team=team,
        key="lr-cap",
        name="LR above cap",
        layer="stability",
        metric="lr",
        detector="threshold",
        params={"above": 0.01},
        severity="L2",
        action="lower_lr",
    ).save()
    rules = by_key(effective_rules(team.pk))
    assert rules["loss-rising"].params["windows"] == 3
    assert rules["lr-cap"].action == "lower_lr"
    assert len(rules) == len(DEFAULT_RULES) + 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"params": {"k": -1, "window": 200}}, "k must be"),
        ({"detector": "no-such-kind"}, "no-such-kind"),
        ({"metric": " | "}, "metric selector is empty"),
        ({"layer": "performance", "action": "terminate_and_isolate"}, "only record"),
    ],
)
def test_an_invalid_row_is_refused_with_the_engines_message(fields, message):
    row = Rule.objects.get(team=None, key="loss-deviation")
    for name, value in fields.items():
        setattr(row, name, value)
    with pytest.raises(ValidationError, match=message):
        row.full_clean()


def test_an_invalid_row_written_behind_the_admins_back_is_skipped_not_fatal(caplog):
    Rule.objects.filter(team=None, key="loss-rising").update(params={"windows": 0})
    rules = by_key(effective_rules(None))
    assert "loss-rising" not in rules and "loss-deviation" in rules
    assert "loss-rising" in caplog.text


def test_rules_are_editable_in_the_admin(admin_client):
    row = Rule.objects.get(team=None, key="loss-deviation")
    assert admin_client.get("/admin/breakers/rule/").status_code == 200
    page = admin_client.get(f"/admin/breakers/rule/{row.pk}/change/")
    assert page.status_code == 200 and b"loss-deviation" in page.content
    form = {
        "team": "",
        "key": row.key,
        "name": row.name,
        "enabled": "",  # unchecked: disabled
        "layer": row.layer,
        "metric": row.metric,
        "per_metric": "on",
        "detector": row.detector,
        "params": '{"k": 2.5, "window": 200, "sustain_points": 4}',
        "clear_after": row.clear_after,
        "clear_after_seconds": row.clear_after_seconds,
        "severity": row.severity,
        "action": row.action,
        "action_params": "{}",
        "runbook": row.runbook,
        "recovery": row.recovery,
        "recovery_budget": row.recovery_budget,
        "why": "a calmer L1",  # every change is a version of the teams' rule sets, with a why
    }
    assert admin_client.post(f"/admin/breakers/rule/{row.pk}/change/", form).status_code == 302
    row.refresh_from_db()
    assert (row.enabled, row.params["k"]) == (False, 2.5)
    form["params"] = '{"k": 0, "window": 200}'
    refused = admin_client.post(f"/admin/breakers/rule/{row.pk}/change/", form)
    assert refused.status_code == 200 and b"k must be" in refused.content


def test_the_guard_rule_migration_pools_the_shipped_row_only():
    """0032: the stored default guard rule still per node (as shipped) alerts once per job; a
    team's own row is the team's choice and stays per node."""
    from django.apps import apps

    migration = importlib.import_module("breakers.migrations.0032_guard_rule_per_job")
    default = Rule.objects.get(team=None, key="update-refused-by-guard")
    Rule.objects.filter(pk=default.pk).update(per_node=True)
    team = team_rule(Team.objects.create(name="research"), "update-refused-by-guard")
    Rule.objects.filter(pk=team.pk).update(per_node=True)
    migration.pool_nodes(apps, None)
    assert not Rule.objects.get(pk=default.pk).per_node
    assert Rule.objects.get(pk=team.pk).per_node
