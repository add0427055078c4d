"""The console in a real browser against the real stack: what an on-call engineer sees live.

Each test drives Chromium (Playwright) at Daphne, with the Celery worker evaluating what a
scripted agent posts over HTTP, PostgreSQL and Redis behind them. Nothing reloads the page:
``window.__sameDocument`` set at the start must still be there at the end.
"""

from __future__ import annotations

import threading

import pytest
from playwright.sync_api import expect

from breakers.detection.rules import install_default_pack
from incidents.alerts.lifecycle import raise_or_update_alert
from incidents.models import Role
from tests.console.browser.conftest import SCREENSHOTS, keep_posting
from tests.console.test_console_pages import signal

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def loss(step: int) -> float:
    return 2.0 + 1.0 / (1 + step / 200) + (step % 5) * 0.004


def screenshot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


def in_thread(function, *args, **kwargs):
    """Call a service from another thread: its after-commit publish uses async_to_sync, which
    refuses the main thread while Playwright's event loop runs there."""
    outcome = {}

    def run() -> None:
        try:
            outcome["value"] = function(*args, **kwargs)
        except BaseException as error:  # re-raised in the test's thread
            outcome["error"] = error
        finally:
            from django.db import connection

            connection.close()  # this thread's own connection, or the test DB cannot be dropped

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def no_reload_since_start(page) -> bool:
    return page.evaluate("window.__sameDocument === true")


def test_the_banner_says_when_the_beat_is_stale(page, live_console, celery_worker, people, log_in):
    people("olga", "vision", Role.ONCALL)
    log_in(page, "olga")  # no beat runs in this test: the watchdog is not watching
    expect(page.locator("#health-banner")).to_contain_text("watchdog beat")
    expect(page.locator("#live-indicator")).to_have_text("live")


def test_the_loss_chart_grows_and_a_nan_pauses_the_job_without_a_reload(
    page, live_console, celery_worker, beat, scripted_agent, people, log_in
):
    install_default_pack()
    agent = scripted_agent(name="llm-70b-pretrain")
    people("olga", "vision", Role.ONCALL)
    agent.heartbeat(99)
    agent.metrics([(s, loss(s)) for s in range(100)])
    log_in(page, "olga")
    page.goto(f"{live_console}/jobs/{agent.job_id}/")
    page.evaluate("window.__sameDocument = true")
    chart = page.locator('figure[data-group="loss"]')
    expect(chart).to_have_attribute("data-last-step", "99")
    expect(page.locator("#live-indicator")).to_have_text("live")
    for start in (100, 200, 300):
        agent.metrics([(s, loss(s)) for s in range(start, start + 100)])
        expect(chart).to_have_attribute("data-last-step", str(start + 99))
    assert int(chart.get_attribute("data-points")) >= 400
    assert page.evaluate("BrakelineCharts.state.charts.loss.plot.data[0].length") >= 400

    agent.metrics([(400, "NaN")])
    expect(page.locator('li.alert[data-severity="L3"]')).to_contain_text("NaN")
    command = agent.wait_for_command("checkpoint_and_pause", 400)
    expect(page.locator("#job-state")).to_have_attribute("data-status", "pausing")
    agent.ack_checkpoint(command, 400)
    expect(page.locator("#job-state")).to_have_attribute("data-status", "paused")
    expect(page.locator("#checkpoint-path")).to_have_text("/ckpt/step-400.pt")
    expect(page.locator("#job-state")).to_contain_text("awaiting confirmation")
    expect(chart).to_have_attribute("data-last-step", "400")
    assert no_reload_since_start(page)
    expect(page.locator("#health-banner")).to_be_hidden(timeout=15_000)  # the beat is up
    screenshot(page, "job-incident.png")

    # The dashboard, with company: a healthy run streaming, and one not started yet.
    healthy = scripted_agent(name="vit-huge-finetune")
    scripted_agent(name="tokenizer-ablation")
    stop = threading.Event()
    thread = keep_posting(healthy, 0, stop)
    try:
        page.goto(f"{live_console}/")
        rows = page.locator("#job-rows tr")
        expect(rows.first).to_contain_text("llm-70b-pretrain")
        expect(rows.first).to_contain_text("L3 alert firing")
        expect(page.locator('tr:has-text("vit-huge-finetune") .badge')).to_have_text("running")
        screenshot(page, "dashboard.png")
    finally:
        stop.set()
        thread.join()


def test_a_viewer_sees_no_pause_button_and_a_forged_post_is_refused(
    page, live_console, celery_worker, scripted_agent, people, log_in
):
    agent = scripted_agent()
    agent.heartbeat(10)
    agent.metrics([(s, loss(s)) for s in range(10)])
    people("vera", "vision", Role.VIEWER)
    log_in(page, "vera")
    expect(page.locator(f'tr[data-job-id="{agent.job_id}"]')).to_be_visible()
    expect(page.locator("button.act")).to_have_count(0)
    page.goto(f"{live_console}/jobs/{agent.job_id}/")
    expect(page.locator("#job-state")).to_contain_text("viewer: read only")
    expect(page.locator("button.act")).to_have_count(0)
    status, body = page.evaluate(
        """async (url) => {
            const response = await fetch(url, {method: "POST", credentials: "same-origin",
              headers: {"Content-Type": "application/json",
                        "X-CSRFToken": document.querySelector('meta[name="csrf-token"]').content},
              body: JSON.stringify({reason: "forged from the console"})});
            return [response.status, await response.json()];
        }""",
        f"/api/v1/jobs/{agent.job_id}/pause",
    )
    assert status == 403 and body["error"] == "forbidden"
    assert "on-call" in body["detail"]


def test_oncall_pauses_with_one_click_and_sees_paused_after_the_ack(
    page, live_console, celery_worker, scripted_agent, people, log_in
):
    agent = scripted_agent()
    agent.heartbeat(50)
    agent.metrics([(s, loss(s)) for s in range(50)])
    people("olga", "vision", Role.ONCALL)
    log_in(page, "olga")
    page.goto(f"{live_console}/jobs/{agent.job_id}/")
    page.evaluate("window.__sameDocument = true")
    page.click("#job-state button.act:has-text('Pause')")  # one click: no dialog
    expect(page.locator("#job-state")).to_have_attribute("data-status", "pausing")
    expect(page.locator("#act-dialog")).to_be_hidden()
    command = agent.wait_for_command("checkpoint_and_pause", 50)
    assert command["reason"] == "one-click pause by olga"
    agent.ack_checkpoint(command, 50)
    expect(page.locator("#job-state")).to_have_attribute("data-status", "paused")
    expect(page.locator("#checkpoint-path")).to_have_text("/ckpt/step-50.pt")
    expect(page.locator("#job-state")).to_contain_text("700.0\xa0MB")
    assert no_reload_since_start(page)


def test_a_manager_approves_an_escalation_and_the_command_reaches_the_agent(
    page, browser, live_console, celery_worker, beat, scripted_agent, people, log_in
):
    agent = scripted_agent(name="llm-70b-pretrain")
    agent.heartbeat(700)
    agent.metrics([(s, loss(s)) for s in range(0, 700, 5)])
    people("olga", "vision", Role.ONCALL)
    people("maria", "vision", Role.MANAGER)
    people("mark", "vision", Role.MANAGER)
    in_thread(raise_or_update_alert, agent.job_id, signal("L2", step=690, rule="loss-sustained"))
    log_in(page, "maria")
    page.goto(f"{live_console}/approvals/")
    page.evaluate("window.__sameDocument = true")
    expect(page.locator("#approvals-live")).to_contain_text("No request is waiting")

    def as_person(username: str):
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        other = context.new_page()
        log_in(other, username)
        return context, other

    # On-call asks from the job page, on the L2 alert.
    context, olga = as_person("olga")
    try:
        olga.goto(f"{live_console}/jobs/{agent.job_id}/")
        olga.click("li.alert[data-severity=L2] button.act:has-text('Request escalation')")
        olga.select_option("#act-fields select", "checkpoint_and_pause")
        olga.fill(
            "#act-fields textarea[name=reason]",
            "loss above 4σ for 10 minutes; lowering the LR did not help",
        )
        olga.click("#act-submit")
        expect(olga.locator("#job-state .escalation")).to_contain_text("checkpoint_and_pause")
    finally:
        context.close()
    row = page.locator("#pending-approvals tr[data-escalation-id]")
    expect(row).to_contain_text("checkpoint_and_pause")  # arrived live on Maria's queue
    expect(row.locator("button.act")).to_have_text(["Approve", "Reject"])
    expect(page.locator("#health-banner")).to_be_hidden(timeout=15_000)  # the beat is up
    screenshot(page, "approvals.png")

    # Another manager decides; Maria's page follows without a reload.
    context, mark = as_person("mark")
    try:
        mark.goto(f"{live_console}/approvals/")
        mark.click("#pending-approvals button.act:has-text('Approve')")
        mark.fill("#act-fields textarea[name=note]", "approved: checkpoint and look")
        mark.click("#act-submit")
        expect(mark.locator("#decided-approvals")).to_contain_text("approved")
    finally:
        context.close()
    expect(page.locator("#approvals-live")).to_contain_text("No request is waiting")
    expect(page.locator("#decided-approvals .badge")).to_have_text("approved")
    assert no_reload_since_start(page)
    command = agent.wait_for_command("checkpoint_and_pause", 700)
    assert "4σ" in command["reason"] or command["kind"] == "checkpoint_and_pause"
