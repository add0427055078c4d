"""Drills without the heavy stack: the console refuses faults to ordinary jobs, the authority
(admins only), the status table, the append-only report, ``rulesets.passing_scenarios``, the API and
the pages. The runner itself is exercised end to end in test_drill_end_to_end.py."""

from __future__ import annotations

import pytest

from breakers.control.commands import issue_command
from breakers.detection import rulesets
from breakers.drills import runs
from breakers.drills.scenarios import DRILL_SET, SCENARIOS, covering, resolve
from breakers.drills.scorecard import Line
from breakers.models import Command, DrillCheck, DrillRun, DrillStatus
from core.append_only import AppendOnlyError
from core.errors import Conflict
from incidents.models import AuditEntry, Job

pytestmark = pytest.mark.django_db

PASSING = [Line("breaker fired", True, "L3 by non-finite-loss-or-gradients", "L3")]


def test_the_console_issues_inject_fault_only_to_a_drill_sandbox(scene):
    params = {"fault": "nan_loss", "at_step": 200}
    with pytest.raises(Conflict, match="not a drill sandbox"):
        issue_command(scene.job_id, "inject_fault", reason="drill", params=params)
    assert not Command.objects.filter(job_id=scene.job_id).exists()
    Job.objects.filter(pk=scene.job_id).update(drill_sandbox=True, status="running")
    issued = issue_command(scene.job_id, "inject_fault", reason="drill", params=params)
    assert issued.created and issued.command.params == params


def test_only_admins_start_drills_and_every_attempt_is_audited(scene):
    for role in ("viewer", "oncall", "manager"):
        response = scene.api(role).post(
            f"/api/v1/teams/{scene.team.pk}/drills", {"scenarios": ["all"]}
        )
        assert response.status_code == 403, role
    assert response.json()["error"] == "forbidden"
    assert scene.api(None).post(f"/api/v1/teams/{scene.team.pk}/drills", {}).status_code == 404
    assert not DrillRun.objects.exists()
    refused = AuditEntry.objects.filter(action="run_drill", allowed=False)
    assert refused.count() == 3


def test_an_admin_queues_one_drill_set_and_it_is_launched_after_commit(
    scene, monkeypatch, django_capture_on_commit_callbacks
):
    launched = []
    monkeypatch.setattr(runs, "launch_drill_set", launched.append)  # no child process here
    api = scene.api("admin")
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"/api/v1/teams/{scene.team.pk}/drills", {"scenarios": ["all"]})
    assert response.status_code == 202, response.content
    body = response.json()
    assert [d["scenario"] for d in body] == list(DRILL_SET)
    assert {d["status"] for d in body} == {"queued"} and len({d["drill_set"] for d in body}) == 1
    assert [str(s) for s in launched] == [body[0]["drill_set"]]
    one = api.get(f"/api/v1/drills/{body[0]['id']}")
    assert one.status_code == 200 and one.json()["checks"] == []
    assert scene.api(None).get(f"/api/v1/drills/{body[0]['id']}").status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"scenarios": ["meteor"]}, "scenarios"),
        ({"scenarios": []}, "scenarios"),
        ({"scenarios": ["nan_loss"], "executor": "kubernetes"}, "executor"),
        ({"scenarios": "nan_loss"}, "scenarios"),
    ],
)
def test_a_bad_drill_request_is_a_400_naming_the_field(scene, body, field):
    response = scene.api("admin").post(f"/api/v1/teams/{scene.team.pk}/drills", body)
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"]
    assert not DrillRun.objects.exists()


def test_a_drill_moves_along_its_table_and_its_report_is_kept_as_judged(scene):
    (run,) = runs.request_drills(scene.team, ["nan_loss"], launch=False)
    with pytest.raises(Conflict):
        runs.finish(run, PASSING)  # queued → passed is not in the table
    runs.start(run)
    with pytest.raises(Conflict):
        runs.start(run)
    failing = [*PASSING, Line("checkpoint loads", False, "did not load", "loads")]
    runs.finish(run, failing, brake_seconds=1.5)
    assert run.status == DrillStatus.FAILED and run.finished_at is not None
    with pytest.raises(Conflict):
        runs.finish(run, PASSING)  # a finished report is never judged again
    check = DrillCheck.objects.get(run=run, name="checkpoint loads")
    with pytest.raises(AppendOnlyError):
        check.save()
    with pytest.raises(AppendOnlyError):
        DrillCheck.objects.filter(run=run).update(passed=True)
    runs.fail_with_error(run, "late")  # no exit from a final status either
    run.refresh_from_db()
    assert run.status == DrillStatus.FAILED and run.error == ""


def test_passing_scenarios_are_per_team_and_rule_set_version(scene):
    passed, failed, other_version = runs.request_drills(
        scene.team, ["nan_loss", "xid", "heartbeat_loss"], launch=False
    )
    DrillRun.objects.filter(pk=other_version.pk).update(ruleset_version=7)
    for run, lines in (
        (passed, PASSING),
        (failed, [Line("x", False, "", "")]),
        (other_version, PASSING),
    ):
        run.refresh_from_db()
        runs.start(run)
        runs.finish(run, lines)
    version = passed.ruleset_version  # the rule-set version in force when they were queued
    assert version is not None and version != 7
    assert rulesets.passing_scenarios(scene.team, version) == {"nan_loss"}
    assert rulesets.passing_scenarios(scene.team, 7) == {"heartbeat_loss"}


def test_the_scenario_registry_answers_which_scenarios_cover_a_rule():
    from breakers.detection.rulepack import DEFAULT_RULES

    keys = {rule["key"] for rule in DEFAULT_RULES} | {"heartbeat-timeout"}
    for scenario in SCENARIOS.values():
        assert set(scenario.rules) <= keys, scenario.name
    assert "nan_loss" in covering("non-finite-loss-or-gradients")
    assert covering("heartbeat-timeout") == ["heartbeat_loss", "hang"]
    assert covering("throughput-drop") == []
    assert [s.name for s in resolve(["all"])] == list(DRILL_SET)
    with pytest.raises(ValueError, match="meteor"):
        resolve(["meteor"])


def test_the_pages_show_a_scorecard_to_members_and_the_form_to_admins(scene, client):
    (run,) = runs.request_drills(scene.team, ["xid"], launch=False)
    runs.start(run)
    runs.finish(
        run,
        [*PASSING, Line("release", True, "job terminated, exit code 75", "75")],
        brake_seconds=0.8,
    )
    client.force_login(scene.person("viewer"))
    page = client.get(f"/teams/{scene.team.pk}/drills/").content.decode()
    assert 'data-scenario="xid"' in page and "Admins run drills." in page
    assert "drill-form" not in page
    scorecard = client.get(f"/drills/{run.pk}/").content.decode()
    assert "exit code 75" in scorecard and 'data-check="release"' in scorecard
    client.force_login(scene.person(None))
    assert client.get(f"/drills/{run.pk}/").status_code == 404
    client.force_login(scene.person("admin"))
    assert 'id="drill-form"' in client.get(f"/teams/{scene.team.pk}/drills/").content.decode()


def test_the_page_offers_slurm_only_where_the_console_can_submit_to_it(
    scene, client, settings, tmp_path, monkeypatch, django_capture_on_commit_callbacks
):
    monkeypatch.setattr(runs, "launch_drill_set", lambda drill_set: None)  # no child process
    settings.SLURM_BIN_DIR = str(tmp_path)  # no sbatch there
    client.force_login(scene.person("admin"))
    page = f"/teams/{scene.team.pk}/drills/"
    assert 'name="executor"' not in client.get(page).content.decode()
    sbatch = tmp_path / "sbatch"
    sbatch.write_text("#!/bin/sh\nexit 1\n")  # only looked for here, never run
    sbatch.chmod(0o755)
    assert 'value="slurm"' in client.get(page).content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        client.post(page, {"scenario": ["xid"], "executor": "slurm"})
    assert DrillRun.objects.get().executor == "slurm"
    refused = client.post(page, {"scenario": ["xid"], "executor": "kubernetes"}, follow=True)
    assert "Unknown executor" in refused.content.decode() and DrillRun.objects.count() == 1
