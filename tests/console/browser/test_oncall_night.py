"""The on-call engineer's night in Chromium against the real stack: a one-click pause whose
confirmation follows it live (waiting → saved) with its reason added afterwards; one NaN's two
L3 alerts acknowledged as one incident from the job page; the incident taken, noted, handed to a
manager; one alert's pages snoozed from its card. Screenshots at 1366×900 and 390×844."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from incidents.alerts.lifecycle import raise_or_update_alert
from incidents.models import Alert, AuditEntry, Role, TimelineEntry
from tests.console.browser.test_live_console import in_thread, loss, no_reload_since_start
from tests.console.browser.test_phone import PHONE, sideways
from tests.console.test_console_pages import signal

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DESKTOP = {"width": 1366, "height": 900}


def shoot(page, name: str) -> None:
    from tests.console.browser.conftest import SCREENSHOTS

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


def test_one_click_pause_confirms_step_and_checkpoint_live_and_takes_a_reason_after(
    browser, live_console, celery_worker, scripted_agent, people, log_in
):
    agent = scripted_agent(name="llm-70b-pretrain")
    agent.heartbeat(50)
    agent.metrics([(s, loss(s)) for s in range(50)])
    people("olga", "vision", Role.ONCALL)
    for viewport, suffix in ((DESKTOP, ""), (PHONE, "-phone")):
        context = browser.new_context(viewport=viewport)
        if not suffix:
            context.add_init_script("window.setInterval = function () { return 0; };")
        page = context.new_page()
        try:
            log_in(page, "olga")
            page.goto(f"{live_console}/jobs/{agent.job_id}/")
            if suffix:  # the phone sees the paused job of the desktop run
                expect(page.locator("#pause-mine")).to_contain_text("(saved")
                shoot(page, f"oncall-pause{suffix}.png")
                assert sideways(page) == 0
                continue
            page.evaluate("window.__sameDocument = true")
            page.click("#job-state button.act:has-text('Pause')")
            # From here the page hears of the pause over the websocket only (the regions' poll
            # is off): the step and the saved checkpoint below are pushed, not polled.
            mine = page.locator("#pause-mine")
            expect(mine).to_contain_text("Paused by you")
            expect(mine).to_contain_text("waiting")
            expect(page.locator("#act-dialog")).to_be_hidden()  # one click, nothing asked
            command = agent.wait_for_command("checkpoint_and_pause", 50)
            expect(mine).to_contain_text("Paused by you at step 50")
            shoot(page, "oncall-pause-waiting.png")
            agent.ack_checkpoint(command, 50)
            expect(mine).to_contain_text("checkpoint /ckpt/step-50.pt (saved in 4.2")
            mine.locator("input[name=reason]").fill("grad norm climbing since step 40")
            mine.locator("button[type=submit]").click()
            expect(mine).to_contain_text("Reason added by olga")
            expect(mine).to_contain_text("grad norm climbing since step 40")
            shoot(page, "oncall-pause.png")
            assert no_reload_since_start(page)
        finally:
            context.close()
    reasons = in_thread(
        lambda: list(AuditEntry.objects.filter(outcome__startswith="reason for pause"))
    )
    assert len(reasons) == 1 and reasons[0].user.username == "olga"


def _acknowledge_the_incident_and_snooze_a_late_alert(page, live_console, agent) -> None:
    page.goto(f"{live_console}/jobs/{agent.job_id}/")
    expect(page.locator("#job-state li.alert")).to_have_count(2)
    # The job's state and its loss chart come first: with two alert cards open, the chart's
    # first 250 px are on the first screen (secondary panels follow it).
    chart = page.locator('figure.chart[data-group="loss"]').bounding_box()
    assert chart is not None and chart["y"] + 250 <= DESKTOP["height"], chart
    shoot(page, "oncall-job-two-alerts.png")
    page.click("#job-state button.act:has-text('Acknowledge incident (2 alerts)')")
    acked = page.locator("#job-state li.alert", has_text="acknowledged by olga")
    expect(acked).to_have_count(2)
    all_at_once = page.locator("#job-state button.act:has-text('Acknowledge incident')")
    expect(all_at_once).to_have_count(0)

    # A third alert of the same episode, snoozed from its card (pages only).
    late = in_thread(raise_or_update_alert, agent.job_id, signal("L2", 300, "loss-spike"))
    card = page.locator(f'#job-state li.alert[data-alert-id="{late.alert.pk}"]')
    card.locator("button.act:has-text('Snooze pages')").click()
    page.select_option("#act-fields select[name=minutes]", "60")
    page.click("#act-submit")
    expect(card).to_contain_text("Pages snoozed until")
    expect(card).to_contain_text("by olga. Brakes are not.")
    shoot(page, "oncall-job-acknowledged.png")


def _take_it_note_it_and_assign_it(page, live_console, incident_id: int) -> None:
    page.goto(f"{live_console}/incidents/{incident_id}/")
    expect(page.locator("#incident-assignee")).to_contain_text("Nobody has taken")
    page.click("#incident-live button.act:has-text('Take it')")
    expect(page.locator("#incident-assignee")).to_contain_text("Handled by you")
    page.fill(
        ".note-form textarea[name=text]",
        "NaN at step 300 on every rank; the step "
        "guard held the update. Checking the data shard of that batch.",
    )
    page.click(".note-form button[type=submit]")
    expect(page.locator("#notes li.note")).to_have_count(1)
    expect(page.locator("#notes")).to_contain_text("olga")
    expect(page.locator("#timeline")).to_contain_text("Checking the data shard")
    expect(page.locator("#incident-live")).to_contain_text("pages snoozed until")
    shoot(page, "oncall-incident.png")
    page.set_viewport_size(PHONE)
    shoot(page, "oncall-incident-phone.png")
    assert sideways(page) == 0
    page.set_viewport_size(DESKTOP)
    page.click("#incident-live button.act:has-text('Assign…')")
    page.select_option("#act-fields select[name=user_id]", label="max (manager)")
    page.click("#act-submit")
    expect(page.locator("#incident-assignee")).to_contain_text("Handled by max")
    review = page.goto(f"{live_console}/incidents/{incident_id}/review/")
    assert review is not None and review.ok
    expect(page.locator("body")).to_contain_text("Checking the data shard")


def test_oncall_acknowledges_one_nan_as_one_incident_takes_it_notes_it_and_snoozes_an_alert(
    browser, live_console, celery_worker, scripted_agent, people, log_in
):
    agent = scripted_agent(name="llm-70b-pretrain")
    agent.heartbeat(300)
    agent.metrics([(s, loss(s)) for s in range(0, 300, 5)])
    people("olga", "vision", Role.ONCALL)
    people("max", "vision", Role.MANAGER)
    nan = in_thread(raise_or_update_alert, agent.job_id, signal("L3", 300, "non-finite")).alert
    in_thread(raise_or_update_alert, agent.job_id, signal("L3", 300, "step-guard"))
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    try:
        log_in(page, "olga")
        _acknowledge_the_incident_and_snooze_a_late_alert(page, live_console, agent)
        _take_it_note_it_and_assign_it(page, live_console, nan.incident_id)
    finally:
        context.close()
    statuses = in_thread(lambda: sorted(Alert.objects.values_list("rule_key", "status")))
    assert statuses == [
        ("loss-spike", "firing"),
        ("non-finite", "acknowledged"),
        ("step-guard", "acknowledged"),
    ]
    acks = in_thread(lambda: TimelineEntry.objects.filter(kind="acknowledged").count())
    assert acks == 2
