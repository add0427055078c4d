"""Snapshots across a resume, end to end: real SDK processes against the real console.

A run trains and checkpoints; a faithful resume (same seed, loader restored) raises nothing; a
careless one (another seed, the loader not restored) raises the L1 "environment changed across
resume", whose diff is one click away on the job page, in the API and on the runbook's entry.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from breakers.models import EnvironmentSnapshot
from breakers.snapshots.resume import RESUME_RULE_KEY
from incidents.models import Alert
from tests.brakeline.live import training_environment
from tests.support.authz import make_member
from tests.support.waiting import wait_for

SCRIPT = Path(__file__).resolve().parent / "scripts" / "resume_run.py"
pytestmark = pytest.mark.django_db(transaction=True)


def run_script(env, *arguments: str, log: Path) -> None:
    with log.open("a") as out:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), *arguments], env=env, stdout=out, stderr=out, timeout=120
        )
    assert done.returncode == 0, log.read_text()[-3000:]


def kinds(job_id: int) -> list[str]:
    return list(
        EnvironmentSnapshot.objects.filter(job_id=job_id)
        .order_by("pk")
        .values_list("kind", flat=True)
    )


def test_a_resume_that_changed_seeds_and_loader_raises_the_l1_with_its_diff(
    live_console, make_agent, client, tmp_path, worker
):
    agent = make_agent(team="research", name="resumable")
    env = training_environment(live_console, agent.token)
    log = tmp_path / "runs.log"
    checkpoints = tmp_path / "checkpoints"

    run_script(env, "train", str(checkpoints), "1", log=log)
    # Two threads take them: either may arrive first.
    wait_for(
        lambda: sorted(kinds(agent.job_id)) == ["checkpoint", "start"],
        "both snapshots",
        context=lambda: f"{kinds(agent.job_id)}\n{log.read_text()[-3000:]}",
    )

    run_script(env, "resume", str(checkpoints), "1", "--restore-loader", log=log)
    wait_for(lambda: kinds(agent.job_id).count("resume") == 1, "the faithful resume's snapshot")
    assert not Alert.objects.filter(job_id=agent.job_id, rule_key=RESUME_RULE_KEY).exists()

    run_script(env, "resume", str(checkpoints), "2", log=log)
    alert = wait_for(
        lambda: Alert.objects.filter(job_id=agent.job_id, rule_key=RESUME_RULE_KEY).first(),
        "the environment-changed L1",
    )
    assert alert.severity == "L1"
    assert alert.description.startswith("environment changed across resume: seeds (python 1 → 2")
    assert "data position (batch_in_epoch 10 → 0" in alert.description
    assert alert.runbook_key == "metrics_differ_after_resume"
    assert alert.runbook["link"] == "snapshots/?diff=resume"
    checkpoint = EnvironmentSnapshot.objects.get(job_id=agent.job_id, kind="checkpoint")
    careless = EnvironmentSnapshot.objects.filter(job_id=agent.job_id, kind="resume").last()
    assert alert.action_params == {"snapshot_before": checkpoint.pk, "snapshot_after": careless.pk}
    assert careless.checkpoint_sha256 == checkpoint.checkpoint_sha256

    from incidents.models import Team

    client.force_login(make_member(Team.objects.get(name="research"), "viewer"))
    diff = client.get(f"/api/v1/jobs/{agent.job_id}/snapshots/diff").json()
    assert diff["chosen"] == "resume" and diff["resume_critical"] == ["seeds", "data_position"]
    assert (diff["before"]["id"], diff["after"]["id"]) == (checkpoint.pk, careless.pk)
    environment = next(g for g in diff["groups"] if g["name"] == "environment")
    # BRAKELINE_TOKEN and BRAKELINE_SECRET_KEY stay redacted on both sides.
    shown = {c["key"]: c for c in environment["changes"]}
    assert shown["BRAKELINE_TOKEN"]["change"] == "hidden"
    assert agent.token not in str(diff)

    page = client.get(f"/jobs/{agent.job_id}/").content.decode()
    link = f"/jobs/{agent.job_id}/snapshots/?a={checkpoint.pk}&amp;b={careless.pk}"
    assert "environment changed across resume" in page and link in page
    assert f'href="/jobs/{agent.job_id}/snapshots/?diff=resume"' in page  # the runbook's link
    diff_page = client.get(f"/jobs/{agent.job_id}/snapshots/").content.decode()
    assert "Changed across the resume: <b>seeds, data_position</b>" in diff_page
    assert client.get(f"/api/v1/jobs/{agent.job_id}/readiness").json()["grade"] != "unknown"
