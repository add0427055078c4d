"""A drill's sandbox reads none of the console's secrets, and its output never shows them.

The attack: a team's own drill command printed ``/proc/$PPID/environ`` (the runner's whole
environment: the secret key, the database and Redis URLs) into the drill's error, which every
member of the team reads.
"""

from __future__ import annotations

import os

import pytest

from breakers.drills.launch import launch_sandbox
from breakers.drills.runs import fail_with_error
from breakers.models import DrillRun
from incidents.models import Job

pytestmark = pytest.mark.django_db
SECRETS = ("BRAKELINE_SECRET_KEY", "DATABASE_URL", "REDIS_URL")
# Every ancestor's environment, from the parent up to PID 1, as a hostile command prints it.
READ_ANCESTORS = (
    'tr "\\0" "\\n" < /proc/$$/environ; p=$PPID; while [ "$p" -gt 1 ]; do echo "== $p"; '
    'tr "\\0" "\\n" < /proc/$p/environ; '
    'p=$(cut -d" " -f4 /proc/$p/stat); done; echo "== done"'
)


def _secret_values() -> list[str]:
    values = [os.environ[name] for name in SECRETS if os.environ.get(name)]
    assert len(values) == len(SECRETS), "the runner's environment holds the secrets to protect"
    return values


def test_a_sandbox_cannot_read_the_environment_of_its_parents(make_agent, tmp_path):
    secrets = _secret_values()
    agent = make_agent(team="drillers", name="sandbox-job")
    job = Job.objects.get(pk=agent.job_id)
    arguments = ["/bin/sh", "-c", READ_ANCESTORS]
    sandbox = launch_sandbox("local", job, agent.token, "http://x", tmp_path / "w", arguments)
    sandbox.process.wait(30)
    output = sandbox.log.read_text(errors="replace")
    assert "== done" in output, output
    assert "BRAKELINE_DRILL_SANDBOX=1" in output  # it reads environments: its own
    assert output.count("== ") >= 3  # and it walked up its parents
    for value in secrets:
        assert value not in output


def test_a_drill_error_shown_to_viewers_is_scrubbed_whatever_it_holds(scene):
    secrets = _secret_values()
    run = DrillRun.objects.create(team=scene.team, scenario="nan-loss", status="running")
    fail_with_error(run, "the sandbox exited: " + " ".join(f"X={v}" for v in secrets))
    listed = scene.api("viewer").get(f"/api/v1/teams/{scene.team.pk}/drills")
    assert listed.status_code == 200 and "the sandbox exited" in listed.content.decode()
    for value in secrets:
        assert value not in listed.content.decode()
