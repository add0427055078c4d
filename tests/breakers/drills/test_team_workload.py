"""A team's own training command as the drill workload, without the heavy stack: the operator's
switch, the admins' authority, every bad command line refused naming its field, the runs
recording what they will run, and the sandbox's environment cut to an allowlist. The drill
itself, on such a command, runs end to end in test_drill_end_to_end.py."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from breakers.drills import runs, workloads
from breakers.drills.launch import base_environment, sandbox_environment
from breakers.models import DrillRun, DrillWorkload
from core.errors import InvalidInput
from incidents.models import AuditEntry

pytestmark = pytest.mark.django_db

SCRIPT = Path(__file__).parent / "scripts" / "own_train.py"
COMMAND = f"{shlex.quote(sys.executable)} {shlex.quote(str(SCRIPT))}"
GOOD = {"command": COMMAND, "verify_command": f"{COMMAND} --verify -"}


def url(scene) -> str:
    return f"/api/v1/teams/{scene.team.pk}/drill-workload"


def test_off_until_the_operator_allows_it(scene):
    response = scene.api("admin").put(url(scene), GOOD)
    assert response.status_code == 403, response.content
    assert "BRAKELINE_DRILL_TEAM_COMMANDS" in response.json()["detail"]
    assert not DrillWorkload.objects.exists()
    assert scene.api("viewer").get(url(scene)).json()["enabled"] is False
    with pytest.raises(InvalidInput) as refused:
        runs.request_drills(scene.team, ["nan_loss"], workload="team", launch=False)
    assert "workload" in refused.value.fields and not DrillRun.objects.exists()


def test_admins_set_it_and_the_runs_record_what_they_run(scene, settings):
    settings.DRILL_TEAM_COMMANDS = True
    for role in ("viewer", "oncall", "manager"):
        assert scene.api(role).put(url(scene), GOOD).status_code == 403, role
    assert scene.api(None).put(url(scene), GOOD).status_code == 404
    saved = scene.api("admin").put(url(scene), GOOD)
    assert saved.status_code == 200, saved.content
    assert saved.json()["command"] == COMMAND and saved.json()["updated_by"]
    assert scene.api("viewer").get(url(scene)).json()["verify_command"].endswith("--verify -")
    (run,) = runs.request_drills(scene.team, ["nan_loss"], workload="team", launch=False)
    assert (run.command, run.verify_command) == (GOOD["command"], GOOD["verify_command"])
    (built_in,) = runs.request_drills(scene.team, ["nan_loss"], launch=False)
    assert built_in.command == ""
    cleared = scene.api("admin").put(url(scene), {"command": ""})
    assert cleared.status_code == 200 and cleared.json()["command"] == ""
    assert not DrillWorkload.objects.exists()
    run.refresh_from_db()
    assert run.command == COMMAND  # the report keeps what ran
    refused = AuditEntry.objects.filter(action="run_drill", allowed=False)
    # Three roles and the stranger; never the system's requests.
    assert refused.count() == 4, list(refused.values_list("user__username", "reason"))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"command": "python train.py", "verify_command": GOOD["verify_command"]}, "command"),
        (
            {"command": "/nonexistent/python x.py", "verify_command": GOOD["verify_command"]},
            "command",
        ),
        (
            {"command": f"{SCRIPT} --steps 3", "verify_command": GOOD["verify_command"]},
            "command",
        ),  # a file, but not executable
        ({"command": f"{COMMAND} 'unclosed", "verify_command": GOOD["verify_command"]}, "command"),
        ({"command": COMMAND}, "verify_command"),
        ({"command": COMMAND, "verify_command": "   "}, "verify_command"),
        ({"command": COMMAND + "\x00", "verify_command": GOOD["verify_command"]}, "command"),
        ({"command": COMMAND + " x" * 1000, "verify_command": GOOD["verify_command"]}, "command"),
        ({"command": ["/bin/true"], "verify_command": GOOD["verify_command"]}, "command"),
        ({"verify_command": GOOD["verify_command"]}, "command"),
    ],
)
def test_a_bad_command_line_is_a_400_naming_the_field(scene, settings, body, field):
    settings.DRILL_TEAM_COMMANDS = True
    response = scene.api("admin").put(url(scene), body)
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"], response.json()
    assert not DrillWorkload.objects.exists()


def test_a_program_gone_since_it_was_set_refuses_the_drill(scene, settings, tmp_path):
    settings.DRILL_TEAM_COMMANDS = True
    program = tmp_path / "train"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    admin = scene.person("admin")
    workloads.save_team_workload(
        admin, scene.team.pk, {"command": str(program), "verify_command": str(program)}
    )
    program.unlink()
    response = scene.api("admin").post(
        f"/api/v1/teams/{scene.team.pk}/drills", {"scenarios": ["xid"], "workload": "team"}
    )
    assert response.status_code == 400 and "workload" in response.json()["fields"]
    assert "not an executable file" in response.json()["detail"]
    assert not DrillRun.objects.exists()


def test_the_sandbox_gets_an_allowlisted_environment_never_the_consoles(
    monkeypatch, settings, tmp_path
):
    secrets = {
        "DATABASE_URL": "postgresql://console:pw@db/brakeline",
        "REDIS_URL": "redis://cache:6379/0",
        "BRAKELINE_SECRET_KEY": "s3cret",
        "BRAKELINE_NOTIFY_PROVIDER_TOKEN": "tok",
        "AWS_SECRET_ACCESS_KEY": "aws",
        "PYTHONPATH": "/srv/console",
    }
    for name, value in {**secrets, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}.items():
        monkeypatch.setenv(name, value)
    env = sandbox_environment("http://console:8000", "tok-of-the-job", tmp_path)
    assert not set(secrets) & set(env), set(secrets) & set(env)
    assert env["PATH"] == "/usr/bin:/bin" and env["LANG"] == "C.UTF-8"
    assert env["BRAKELINE_TOKEN"] == "tok-of-the-job" and env["BRAKELINE_DRILL_SANDBOX"] == "1"
    assert env["BRAKELINE_CHECKPOINT_DIR"] == str(tmp_path / "checkpoints")
    assert "BRAKELINE_TOKEN" not in base_environment()  # the verifier never gets the token
    settings.DRILL_ENVIRONMENT_ALLOWLIST = ("PATH", "AWS_SECRET_ACCESS_KEY")  # an operator's
    assert "AWS_SECRET_ACCESS_KEY" in sandbox_environment("http://c", "t", tmp_path)


def test_the_drills_page_offers_the_form_to_admins_where_allowed(scene, client, settings):
    client.force_login(scene.person("admin"))
    page = f"/teams/{scene.team.pk}/drills/"
    assert 'id="workload-form"' not in client.get(page).content.decode()
    settings.DRILL_TEAM_COMMANDS = True
    assert 'id="workload-form"' in client.get(page).content.decode()
    answer = client.post(page, {"form": "workload", **GOOD}, follow=True).content.decode()
    assert "drill workload is saved" in answer and 'value="team"' in answer
    refused = client.post(page, {"form": "workload", "command": "train.py"}, follow=True)
    assert "absolute path" in refused.content.decode()
    assert DrillWorkload.objects.get().command == COMMAND  # the refused one changed nothing
    client.force_login(scene.person("manager"))
    assert 'id="workload-form"' not in client.get(page).content.decode()
