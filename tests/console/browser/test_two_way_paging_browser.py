"""The on-call engineer's night in Chromium, on a console with the demo's Outbox on (its own
Daphne, BRAKELINE_NOTIFY_OUTBOX=true): the dashboard says who is on call now and next, the
paging page lists the rotation, the Outbox shows the pages and acknowledges by "Press 1", and
the chat message's link page acknowledges once. Desktop (1366×900) and phone (390×844)
screenshots of each land in docs/screenshots/."""

from __future__ import annotations

import subprocess
from datetime import date, time, timedelta

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from bench._stack import daphne_command
from incidents.alerts.lifecycle import raise_or_update_alert
from incidents.jobs import create_job
from incidents.models import Contact, Delivery, Membership, NotificationPolicy, OnCallRotation
from incidents.notifications.reply_codes import ack_link
from incidents.notifications.rounds import dispatch_alert
from tests.conftest import free_port, server_environment, wait_for_port
from tests.console.browser.conftest import SCREENSHOTS
from tests.console.browser.test_live_console import in_thread
from tests.console.browser.test_phone import sideways
from tests.incidents.test_notifications import nan_signal, send_all

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SIZES = {"desktop": {"width": 1366, "height": 900}, "phone": {"width": 390, "height": 844}}
PASSWORD = "pw-for-tests"


@pytest.fixture
def outbox_console(django_db_blocker):
    port = free_port()
    with django_db_blocker.unblock():
        env = server_environment(BRAKELINE_NOTIFY_OUTBOX="true")
    process = subprocess.Popen(daphne_command(port), env=env)
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=20)


def night(settings, url: str) -> dict:
    """Team night-shift: olga and max in a weekly rotation, an L3 paged into the Outbox."""
    settings.NOTIFY_OUTBOX, settings.BRAKELINE_PUBLIC_URL = True, url
    job = create_job("night-shift", "llm-70b-pretrain").job
    users = get_user_model().objects
    olga = users.create_user("olga", "olga@example.org", PASSWORD)
    max_ = users.create_user("max", "max@example.org", PASSWORD)
    for person, role, phone in ((olga, "oncall", "+15551110001"), (max_, "manager", "+1555222")):
        Membership.objects.create(user=person, team=job.team, role=role)
        Contact.objects.create(user=person, phone=phone)
    NotificationPolicy.objects.update_or_create(
        team=job.team, defaults={"chat_webhook_url": "https://chat.example.invalid/hook"}
    )
    OnCallRotation.objects.create(
        team=job.team,
        name="primary",
        people=[olga.pk, max_.pk],
        length_days=7,
        handoff_time=time(9),
        time_zone="Europe/Paris",
        starts_on=date.today() - timedelta(days=1),
    )
    alert = raise_or_update_alert(job.pk, nan_signal()).alert
    send_all(dispatch_alert(alert.pk))
    chat = Delivery.objects.get(alert=alert, channel="chat")
    return {"team": job.team.pk, "alert": alert.pk, "chat_link": ack_link(chat.pk)}


def shoot(page, name: str, size: str) -> None:
    assert sideways(page) <= 0, f"{name} is wider than the {size} screen"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}-{size}.png"), full_page=True)


def test_the_outbox_the_rotation_and_the_acknowledge_link(browser, outbox_console, settings):
    facts = in_thread(night, settings, outbox_console)
    for size, viewport in SIZES.items():
        context = browser.new_context(viewport=viewport, is_mobile=size == "phone")
        page = context.new_page()
        page.goto(outbox_console + "/login/")
        page.fill("input[name=username]", "olga")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(outbox_console + "/")
        expect(page.locator("#on-call")).to_contain_text("on call now olga")
        expect(page.locator("#on-call")).to_contain_text("next max from")
        shoot(page, "on-call-now-next", size)
        page.goto(f"{outbox_console}/teams/{facts['team']}/paging/")
        expect(page.locator("#rotations")).to_contain_text("olga → max")
        shoot(page, "rotations", size)
        page.goto(outbox_console + "/outbox/")
        expect(page.locator(".outbox-message")).to_have_count(2)
        expect(page.locator(".channel-phone pre")).to_contain_text("Press 1 to acknowledge.")
        shoot(page, "outbox", size)
        page.goto(facts["chat_link"])
        expect(page.locator("#ack-link")).to_contain_text("Paged to olga by chat")
        shoot(page, "ack-link", size)
        context.close()
    context = browser.new_context(viewport=SIZES["phone"], is_mobile=True)
    page = context.new_page()
    page.goto(facts["chat_link"])
    page.click("#ack-button")
    expect(page.locator(".message.success")).to_contain_text("Acknowledged as olga")
    shoot(page, "ack-link-done", "phone")
    page.goto(facts["chat_link"])
    expect(page.locator("#ack-link")).to_contain_text("acknowledged")
    expect(page.locator("#ack-button")).to_have_count(0)
    context.close()
