"""Rolling back from the job page: the dialog offers the job's checkpoint catalogue, the last
clean checkpoint preselected, and the job page and the incident show the hashes."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from breakers.checkpoints import CheckpointReport, record_checkpoint
from breakers.detection.rules import install_default_pack
from breakers.models import Command
from incidents.models import Incident, Role
from tests.console.browser.conftest import SCREENSHOTS
from tests.console.browser.test_live_console import in_thread, loss

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_roll_back_dialog_offers_the_catalogue_with_the_last_clean_one_first(
    browser, live_console, celery_worker, scripted_agent, people, log_in
):
    install_default_pack()
    agent = scripted_agent(name="llm-7b")
    people("olga", "vision", Role.ONCALL)
    agent.heartbeat(199)
    agent.metrics([(s, loss(s)) for s in range(200)])
    in_thread(
        lambda: record_checkpoint(
            agent.job_id, CheckpointReport(path="/ckpt/step-150.pt", sha256="cd" * 32, step=150)
        )
    )
    agent.metrics([(200, "NaN")])
    command = agent.wait_for_command("checkpoint_and_pause", 200)
    agent.ack_checkpoint(command, 200)  # weights_step 199: the guard kept the NaN out: clean
    incident = in_thread(lambda: Incident.objects.get(job_id=agent.job_id))

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        log_in(page, "olga")
        page.goto(f"{live_console}/jobs/{agent.job_id}/")
        table = page.locator("#checkpoints")
        expect(table).to_contain_text("ab" * 32)
        expect(table).to_contain_text("cd" * 32)
        expect(table.locator("tr.preselected")).to_contain_text("step-200")
        page.locator("button.act", has_text="Roll back").click()
        select = page.locator("#act-fields select[name=checkpoint]")
        expect(select).to_be_visible()
        first = select.locator("option").first
        expect(first).to_contain_text("step 200 · clean · brake")
        expect(select.locator("option")).to_have_count(2)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "roll-back-dialog.png"), full_page=True)
        page.locator("#act-submit").click()
        expect(page.locator("#act-dialog")).not_to_be_visible()
        resume = in_thread(lambda: Command.objects.filter(job_id=agent.job_id, kind="resume").get())
        assert resume.params["checkpoint"] == "/ckpt/step-200.pt"
        assert resume.params["sha256"] == "ab" * 32
        page.goto(f"{live_console}/incidents/{incident.pk}/")
        expect(page.locator("#checkpoints")).to_contain_text("ab" * 32)
    finally:
        page.close()


def test_the_catalogue_follows_a_brake_and_a_report_without_a_reload(
    browser, live_console, celery_worker, scripted_agent, people, log_in
):
    """The page opened before any checkpoint: the brake's checkpoint (in its ack) and a later
    report appear in the catalogue as they happen, never "No checkpoint reported yet" beside a
    state panel that shows the saved one."""
    install_default_pack()
    agent = scripted_agent(name="llm-7b")
    people("olga", "vision", Role.ONCALL)
    agent.heartbeat(99)
    agent.metrics([(s, loss(s)) for s in range(100)])
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        log_in(page, "olga")
        page.goto(f"{live_console}/jobs/{agent.job_id}/")
        page.evaluate("window.__sameDocument = true")
        table = page.locator("#checkpoints")
        expect(table).to_contain_text("No checkpoint reported yet")
        agent.metrics([(100, "NaN")])
        agent.ack_checkpoint(agent.wait_for_command("checkpoint_and_pause", 100), 100)
        # Well within the catalogue's 15 s poll: the ack's event brings it.
        expect(table).to_contain_text("ab" * 32, timeout=10_000)
        expect(table).not_to_contain_text("No checkpoint reported yet")
        report = CheckpointReport(path="/ckpt/step-90.pt", sha256="cd" * 32, step=90)
        in_thread(lambda: record_checkpoint(agent.job_id, report))
        expect(table).to_contain_text("cd" * 32, timeout=10_000)
        assert page.evaluate("window.__sameDocument === true")  # no reload
    finally:
        page.close()
