"""The job page's readiness grade and a snapshot diff, in Chromium, desktop and phone.

Real SDK runs (tests/breakers/snapshots/scripts/resume_run.py) send the snapshots: a run
checkpoints, a careless resume (another seed, the loader not restored) raises the L1. The pages
are looked at as an on-call person would, and the screenshots land in docs/screenshots/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import expect

from breakers.models import EnvironmentSnapshot
from tests.brakeline.live import training_environment
from tests.console.browser.conftest import SCREENSHOTS
from tests.support.waiting import wait_for

SCRIPTS = Path(__file__).resolve().parents[2] / "breakers" / "snapshots" / "scripts"
SCRIPT = SCRIPTS / "resume_run.py"
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def run(env, *arguments):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *arguments], env=env, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]


def test_readiness_and_the_resume_diff(
    page, live_console, make_agent, people, log_in, beat, worker, tmp_path
):
    agent = make_agent(team="vision", name="llm-7b-sft")
    people("ana", "vision", "oncall")
    env = training_environment(live_console, agent.token)
    env["BRAKELINE_IMAGE"] = "registry.local/llm-train:latest"
    run(env, "train", str(tmp_path), "1")
    run(env, "resume", str(tmp_path), "2")
    # Each process sends its start snapshot; the second one also its resume snapshot.
    wait_for(
        lambda: EnvironmentSnapshot.objects.filter(job_id=agent.job_id).count() == 4,
        "four snapshots",
    )
    log_in(page, "ana")

    page.goto(f"{live_console}/jobs/{agent.job_id}/")
    panel = page.locator("#readiness")
    expect(panel.locator("#readiness-grade")).to_have_text("not ready")
    expect(panel.locator("[data-item=image]")).to_contain_text("llm-train:latest is a tag")
    expect(page.locator("#pause-warning")).to_contain_text("Before relying on a pause")
    expect(page.locator("#resume-changed")).to_contain_text("environment changed across resume")
    expect(page.locator(".runbook-link").first).to_have_text("the snapshot diff across the resume")
    panel.scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "job-readiness.png"), full_page=True)

    page.locator("#resume-changed a").click()
    expect(page.locator("#resume-critical")).to_contain_text("seeds, data_position")
    seeds = page.locator(".diff-group[data-group=seeds]")
    expect(seeds).to_contain_text("python")
    expect(page.locator(".diff-group[data-group=environment]")).to_contain_text(
        "redacted on both sides"
    )
    page.screenshot(path=str(SCREENSHOTS / "snapshot-diff.png"), full_page=True)

    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{live_console}/jobs/{agent.job_id}/")
    expect(page.locator("#readiness-grade")).to_have_text("not ready")
    page.screenshot(path=str(SCREENSHOTS / "phone-job-readiness.png"), full_page=True)
    page.goto(f"{live_console}/jobs/{agent.job_id}/snapshots/?diff=resume")
    expect(page.locator("#resume-critical")).to_be_visible()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the diff page scrolls sideways on a phone ({width} px)"
    page.screenshot(path=str(SCREENSHOTS / "phone-snapshot-diff.png"), full_page=True)

    page.set_viewport_size({"width": 1400, "height": 1000})
    page.goto(f"{live_console}/")
    expect(page.locator("#readiness-summary")).to_contain_text("llm-7b-sft")
    page.screenshot(path=str(SCREENSHOTS / "dashboard-readiness.png"), full_page=True)
