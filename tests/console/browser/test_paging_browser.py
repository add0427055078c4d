"""Issue 23's pages in Chromium against the real stack: an admin fixes a team that pages
nobody (the red banner goes away), sends a real test page through the senders to a local
webhook, a manager silences a job, an on-call asks a manager to confirm a pause, and a new L3
becomes a browser notification. Screenshots of each page at desktop width."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from breakers.detection.rules import install_default_pack
from incidents.alerts.lifecycle import raise_or_update_alert
from incidents.models import Delivery, Membership, Role, Silence
from tests.console.browser.test_live_console import in_thread, loss, screenshot
from tests.console.test_console_pages import signal
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _drills_go_to_olga_as_their_receiver(page, olga) -> None:
    """The team's drills page olga as their receiver; a policy naming none is refused first."""
    page.select_option("#drill-delivery select[name=drill_delivery]", "receivers")
    page.click("#policy-form button[type=submit]")
    expect(page.locator(".message.error")).to_contain_text("a drill must page somebody")
    page.select_option("#drill-delivery select[name=drill_delivery]", "receivers")
    page.locator("#drill-delivery label", has_text="olga").locator("input").check()
    page.click("#policy-form button[type=submit]")
    expect(page.locator(".message.success")).to_have_text("Notification policy saved.")
    expect(page.locator("#drill-delivery select[name=drill_delivery]")).to_have_value("receivers")
    olga_box = page.locator("#drill-delivery label", has_text="olga").locator("input")
    expect(olga_box).to_be_checked()
    receivers = in_thread(
        lambda: list(
            Membership.objects.get(user=olga).team.notification_policy.drill_receivers.all()
        )
    )
    assert receivers == [olga]


def test_an_admin_fixes_a_team_that_pages_nobody_and_sends_a_test_page(
    page, live_console, celery_worker, beat, scripted_agent, people, log_in, receiver
):
    agent = scripted_agent(name="llm-70b-pretrain")
    agent.heartbeat(10)
    people("ana", "vision", Role.ADMIN)
    olga = people("olga", "vision", Role.ONCALL)
    people("max", "vision", Role.MANAGER)
    team_id = in_thread(lambda: Membership.objects.get(user=olga).team_id)
    log_in(page, "ana")
    nobody = page.locator(".banner.paging-nobody")
    expect(nobody).to_contain_text("Alerts of team vision page nobody")
    nobody.locator("a").click()
    page.wait_for_url(f"{live_console}/teams/{team_id}/paging/")
    expect(page.locator("#reach")).to_contain_text("An L3 alert of this team pages nobody")

    page.fill("input[name=chat_webhook_url]", receiver.url + "/hooks/chat")
    page.click("#policy-form button[type=submit]")
    expect(page.locator(".message.success")).to_have_text("Notification policy saved.")
    expect(page.locator(".banner.paging-nobody")).to_have_count(0)
    expect(page.locator("#reach")).to_contain_text("An L3 alert now pages: the team chat")

    row = page.locator('#contacts tr[data-user="olga"]')
    row.locator("input[type=tel]").fill("+15551234567")
    row.locator("button:has-text('Save')").click()
    expect(page.locator(".message.success")).to_have_text("Phone number saved.")
    page.select_option("#shift-form select[name=user_id]", label="olga (oncall)")
    page.click("#shift-form button[type=submit]")
    expect(page.locator("#shifts")).to_contain_text("olga")
    expect(page.locator('#contacts tr[data-user="olga"]')).to_contain_text("on call")

    row = page.locator('#contacts tr[data-user="olga"]')
    row.locator("select[name=channel]").select_option("chat")
    row.locator("button:has-text('Send a test page')").click()
    expect(page.locator(".message.success")).to_contain_text("Test page queued")
    expect(page.locator("#test-deliveries .status").first).to_contain_text("delivered")
    sent = receiver.to("/hooks/chat")
    assert len(sent) == 1 and b"TEST vision" in sent[0].body  # a real POST through the sender
    expect(page.locator("#health-banner")).to_be_hidden(timeout=15_000)
    screenshot(page, "paging.png")

    _drills_go_to_olga_as_their_receiver(page, olga)

    page.goto(f"{live_console}/teams/")
    expect(page.locator(f'#teams tr[data-team-id="{team_id}"]')).to_contain_text("olga")
    screenshot(page, "teams.png")


def test_a_manager_silences_a_job_and_its_nan_is_braked_and_shown_silenced(
    page, live_console, celery_worker, beat, scripted_agent, people, log_in
):
    install_default_pack()
    agent = scripted_agent(name="llm-70b-pretrain")
    agent.heartbeat(99)
    agent.metrics([(s, loss(s)) for s in range(100)])
    people("max", "vision", Role.MANAGER)
    log_in(page, "max")
    page.goto(f"{live_console}/silences/")
    page.select_option("#silence-form select[name=job_id]", label="vision/llm-70b-pretrain")
    page.select_option("#silence-form select[name=hours]", label="4 hours")
    page.fill("#silence-form input[name=reason]", "storage maintenance, restarts expected")
    page.click("#silence-form button[type=submit]")
    expect(page.locator("#current-silences")).to_contain_text("storage maintenance")
    silence = in_thread(lambda: Silence.objects.get())
    assert silence.job_id == agent.job_id

    agent.metrics([(100, "NaN")])
    agent.wait_for_command("checkpoint_and_pause", 100)  # the brake is never silenced
    page.goto(f"{live_console}/alerts/")
    expect(page.locator("#open-alerts tr.alert-silenced")).to_contain_text("Silenced until")
    expect(page.locator("#health-banner")).to_be_hidden(timeout=15_000)
    screenshot(page, "alerts-silenced.png")
    page.goto(f"{live_console}/silences/")
    screenshot(page, "silences.png")
    page.goto(f"{live_console}/incidents/")
    expect(page.locator("#incidents tr[data-incident-id]")).to_have_count(1)
    screenshot(page, "incidents.png")
    page.goto(f"{live_console}/audit/")
    expect(page.locator("#audit")).to_contain_text("manage_silences")
    expect(page.locator("#audit")).to_contain_text("page_silenced")
    screenshot(page, "audit.png")
    assert in_thread(lambda: Delivery.objects.filter(alert__job_id=agent.job_id).count()) == 0


def test_oncall_sees_who_confirms_a_pause_asks_for_it_and_a_manager_sees_one_resume(
    browser, live_console, celery_worker, scripted_agent, people, log_in
):
    agent = scripted_agent(name="llm-70b-pretrain")
    agent.heartbeat(50)
    people("olga", "vision", Role.ONCALL)
    people("max", "vision", Role.MANAGER)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    try:
        log_in(page, "olga")
        page.goto(f"{live_console}/jobs/{agent.job_id}/")
        page.click("#job-state button.act:has-text('Pause')")
        agent.ack_checkpoint(agent.wait_for_command("checkpoint_and_pause", 50), 50)
        expect(page.locator("#awaiting")).to_contain_text(
            "awaiting confirmation by a manager or an admin (max)"
        )
        page.click("#job-state button.act:has-text('Ask a manager to confirm')")
        page.fill("#act-fields textarea[name=note]", "please have a look")
        page.click("#act-submit")
        expect(page.locator("#act-dialog")).to_be_hidden()
        wait_for(
            lambda: in_thread(lambda: Delivery.objects.filter(purpose="confirmation").exists()),
            "the managers' page",
        )
        context.close()
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        log_in(page, "max")
        page.goto(f"{live_console}/jobs/{agent.job_id}/")
        labels = page.locator("#job-state .state-line button.act").all_inner_texts()
        assert "Confirm & resume" in labels and "Resume" not in labels, labels
    finally:
        context.close()


def test_a_new_l3_is_a_browser_notification_for_a_signed_in_oncall(
    browser, live_console, celery_worker, scripted_agent, people, log_in
):
    agent = scripted_agent(name="llm-70b-pretrain")
    agent.heartbeat(10)
    people("olga", "vision", Role.ONCALL)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        log_in(page, "olga")
        expect(page.locator("#notify-offer")).to_be_visible()  # asked only after a click
        context.grant_permissions(["notifications"], origin=live_console)
        page.click("#notify-enable")
        expect(page.locator("#notify-offer")).to_be_hidden()
        expect(page.locator("#live-indicator")).to_have_text("live")
        page.wait_for_function("() => window.Brakeline && window.Brakeline.connected")
        in_thread(raise_or_update_alert, agent.job_id, signal("L2", step=9, rule="loss-sustained"))
        in_thread(raise_or_update_alert, agent.job_id, signal("L3", step=10))
        page.wait_for_function("() => window.Brakeline.notified.length >= 1")
        assert page.evaluate("window.Brakeline.notified") == [
            "L3 llm-70b-pretrain: rule non-finite"
        ]  # the L2 before it did not notify
    finally:
        context.close()


def test_the_pending_approvals_badge_follows_requests_live(
    page, live_console, celery_worker, scripted_agent, people, log_in
):
    from breakers.control.escalations import request_escalation

    agent = scripted_agent(name="llm-70b-pretrain")
    agent.heartbeat(10)
    olga = people("olga", "vision", Role.ONCALL)
    people("max", "vision", Role.MANAGER)
    alert = in_thread(raise_or_update_alert, agent.job_id, signal("L2", rule="loss-sustained"))
    log_in(page, "max")
    page.goto(f"{live_console}/incidents/")
    page.evaluate("window.__sameDocument = true")
    badge = page.locator("#pending-badge")
    expect(badge).to_be_hidden()
    expect(page.locator("#live-indicator")).to_have_text("live")
    in_thread(
        request_escalation,
        olga,
        agent.job_id,
        kind="checkpoint_and_pause",
        reason="loss keeps climbing",
        alert_id=alert.alert.pk,
    )
    expect(badge).to_have_text("1")  # no reload: the escalation event refreshed it
    assert page.evaluate("window.__sameDocument === true")
