"""The rules page (admins change rules there, everyone reads the history), the "not drilled
since <change>" badge on the job page and the dashboard, the Django admin's path, and the
drill schedule."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.test import Client

from breakers.detection import rulesets
from breakers.detection.tasks import schedule_drills
from breakers.models import DrillRun, Rule, RuleSetVersion
from config.schedule import PERIODIC

pytestmark = pytest.mark.django_db


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_admin_edits_a_rule_on_the_page_and_the_badge_names_the_change(crew):
    admin = browser(crew.person("admin"))
    page = f"/teams/{crew.team.pk}/rules/"
    shown = admin.get(page)
    assert shown.status_code == 200 and b"Save as a new version" in shown.content
    form = {
        "op": "update",
        "key": "loss-rising",
        "why": "our loss is noisier",
        "name": "Rising",
        "layer": "stability",
        "metric": "loss",
        "detector": "rising",
        "params": '{"window": 80, "windows": 5}',
        "severity": "L3",
        "action": "checkpoint_and_pause",
        "action_params": "{}",
        "clear_after": "2",
        "clear_after_seconds": "0",
        "runbook": "loss-divergence",
        "per_metric": "on",
        "enabled": "on",
    }
    after = admin.post(page, form, follow=True)
    assert b"Rules changed: a new version is recorded below." in after.content
    rule = Rule.objects.get(team=crew.team, key="loss-rising")
    assert (rule.name, rule.params) == ("Rising", {"window": 80, "windows": 5})
    assert (
        "loss-rising: name Loss rising over consecutive windows → Rising" in after.content.decode()
    )

    job = admin.get(f"/jobs/{crew.job_id}/").content.decode()
    assert "not drilled since v2: loss-rising changed (admin-" in job
    assert f'href="/teams/{crew.team.pk}/drills/?scenario=' in job
    dashboard = admin.get("/").content.decode()
    assert "not drilled since v2: loss-rising changed" in dashboard

    refused = admin.post(page, {**form, "params": '{"window": NaN}'}, follow=True)
    assert b"params is not valid JSON" in refused.content
    refused = admin.post(page, {**form, "params": '{"window": 0}', "why": "x"}, follow=True)
    assert b"changes[0].fields.params" in refused.content
    assert RuleSetVersion.objects.filter(team=crew.team).count() == 2


def test_a_viewer_reads_the_rules_and_history_without_forms(crew):
    rulesets.change_rules(
        crew.person("admin"), crew.team.pk, "noisy", [{"op": "disable", "key": "loss-deviation"}]
    )
    viewer = browser(crew.person("viewer"))
    shown = viewer.get(f"/teams/{crew.team.pk}/rules/").content.decode()
    assert "Only an admin of the team changes them." in shown
    assert "Save as a new version" not in shown and "noisy" in shown
    assert "loss-deviation: enabled True → False" in shown
    viewer.post(
        f"/teams/{crew.team.pk}/rules/", {"op": "enable", "key": "loss-deviation", "why": "mine"}
    )
    assert not Rule.objects.get(team=crew.team, key="loss-deviation").enabled
    assert browser(crew.person(None)).get(f"/teams/{crew.team.pk}/rules/").status_code == 404


def test_the_badge_says_drilled_when_every_covering_scenario_passed(crew, monkeypatch):
    coverage = {"nan_loss": ("non-finite-loss-or-gradients",), "hang": ("loss-rising",)}
    results = rulesets.DrillResults(coverage, {"nan_loss", "hang"})
    monkeypatch.setattr(rulesets, "_drill_results", lambda team, version: results)
    assert rulesets.drill_badge(crew.team).drilled
    page = browser(crew.person("viewer")).get(f"/jobs/{crew.job_id}/").content.decode()
    assert "not drilled" not in page and 'class="drill-badge drilled"' in page
    rulesets.change_rules(
        crew.person("admin"), crew.team.pk, "x", [{"op": "disable", "key": "loss-rising"}]
    )  # the drills passed on v1, not on v2
    monkeypatch.setattr(
        rulesets,
        "_drill_results",
        lambda team, version: rulesets.DrillResults(
            coverage, {"nan_loss", "hang"} if version == 1 else set()
        ),
    )
    badge = rulesets.drill_badge(crew.team)
    assert (badge.drilled, badge.missing_scenarios) == (False, ["nan_loss"])


def test_the_django_admin_edits_the_default_pack_through_the_service(crew, admin_client):
    row = Rule.objects.get(team=None, key="loss-rising")
    form = {
        "name": row.name,
        "enabled": "on",
        "layer": row.layer,
        "metric": row.metric,
        "per_metric": "on",
        "detector": row.detector,
        "params": '{"window": 60}',
        "clear_after": row.clear_after,
        "clear_after_seconds": 0,
        "severity": row.severity,
        "action": row.action,
        "action_params": "{}",
        "runbook": row.runbook,
        "recovery": row.recovery,
        "recovery_budget": row.recovery_budget,
    }
    url = f"/admin/breakers/rule/{row.pk}/change/"
    assert b"This field is required" in admin_client.post(url, form).content  # no why
    assert admin_client.post(url, {**form, "why": "pack 2027.1"}).status_code == 302
    again = admin_client.post(url, {**form, "why": "once more"})  # the same values: no version
    assert again.status_code == 200 and b"Nothing changed." in again.content
    refused = admin_client.post(url, {**form, "why": "x", "params": '{"window": 0}'})
    assert refused.status_code == 200 and b"window must be" in refused.content
    version = rulesets.current_version(crew.team)
    assert (version.why, version.actor.username) == ("pack 2027.1", "admin")
    assert rulesets.describe_lines(version)[0].startswith("loss-rising: params.min_rise_se")
    team_row = Rule.objects.create(
        team=crew.team, **{**{n: getattr(row, n) for n in Rule.SPEC_FIELDS}, "key": "own"}
    )
    assert (
        admin_client.post(
            f"/admin/breakers/rule/{team_row.pk}/change/", {**form, "why": "x"}
        ).status_code
        == 403
    )  # read-only here
    assert admin_client.post(f"/admin/breakers/rule/{row.pk}/delete/").status_code == 403
    listed = admin_client.get("/admin/breakers/rulesetversion/")
    assert listed.status_code == 200 and b"loss-rising changed" in listed.content
    assert (
        admin_client.post(f"/admin/breakers/rulesetversion/{version.pk}/delete/").status_code == 403
    )


def test_the_drill_schedule_is_due_once_per_team_and_period(crew, monkeypatch, settings):
    monkeypatch.setattr(rulesets, "_drill_results", lambda team, version: rulesets.DrillResults())
    assert rulesets.due_drills() == [] and schedule_drills() == 0  # no scenario: nothing due
    coverage = {"nan_loss": ("non-finite-loss-or-gradients",), "xid": ("hardware-error",)}
    monkeypatch.setattr(
        rulesets, "_drill_results", lambda team, version: rulesets.DrillResults(coverage, set())
    )
    settings.DRILL_INTERVAL_SECONDS = 86400.0
    settings.DRILL_SCHEDULE = False  # a bench's or the tests' own stacks: the beat starts none
    assert rulesets.due_drills() and schedule_drills() == 0
    settings.DRILL_SCHEDULE = True
    monday, later = (datetime(2026, 11, 30, h, tzinfo=UTC) for h in (1, 23))
    tuesday = datetime(2026, 12, 1, 0, tzinfo=UTC)
    first = rulesets.due_drills(monday)
    assert [(d.team_id, d.scenarios) for d in first] == [(crew.team.pk, ["nan_loss", "xid"])]
    assert rulesets.due_drills(later) == first  # the same key all period: started once
    assert rulesets.due_drills(tuesday)[0].idempotency_key != first[0].idempotency_key
    (due_now,) = rulesets.due_drills()
    assert schedule_drills() == 1  # queued as the system, stamped with the version in force
    queued = DrillRun.objects.filter(team=crew.team)
    assert sorted(r.scenario for r in queued) == ["nan_loss", "xid"]
    assert {r.ruleset_version for r in queued} == {rulesets.current_version(crew.team).number}
    assert {r.schedule_key for r in queued} == {due_now.idempotency_key}  # its failure pages
    assert rulesets.due_drills() == [] and schedule_drills() == 0  # once per period
    # A second beat that read "due" before the first one's set was committed: the key's
    # unique constraint refuses its copy.
    monkeypatch.setattr(rulesets, "_drilled_since", lambda team, version, period: False)
    assert schedule_drills() == 0 and queued.count() == 2
    assert any(p.task == "rulesets.schedule_drills" for p in PERIODIC)


def test_a_passing_drill_set_makes_the_version_drilled_until_a_rule_changes(crew):
    """The badge reads the drills themselves: the CI drill set passing on the version in force
    drills it; one rule changed makes a new version nobody drilled yet."""
    from breakers.drills import runs
    from breakers.models import DrillStatus

    assert not rulesets.drill_badge(crew.team).drilled
    for run in runs.request_drills(crew.team, ["all"], launch=False):
        assert run.ruleset_version == rulesets.current_version(crew.team).number
        assert runs.move(run, DrillStatus.RUNNING) and runs.move(run, DrillStatus.PASSED)
    badge = rulesets.drill_badge(crew.team)
    assert badge.drilled and badge.missing_scenarios == []
    rulesets.change_rules(
        crew.person("admin"), crew.team.pk, "quieter", [{"op": "disable", "key": "loss-rising"}]
    )
    badge = rulesets.drill_badge(crew.team)
    assert not badge.drilled and "nan_loss" in badge.missing_scenarios
    assert badge.since.startswith(f"v{badge.version}: loss-rising")
