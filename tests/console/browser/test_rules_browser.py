"""The rules page in Chromium: an admin disables a rule with a reason, the new version and its
diff are in the history, the job page says "not drilled since" that change with a link to the
drills; the page fits a 390 px phone. Screenshots: docs/screenshots/rules.png, phone-rules.png."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from breakers.detection.rules import install_default_pack
from incidents.models import Role
from tests.console.browser.conftest import SCREENSHOTS
from tests.console.browser.test_live_console import in_thread, screenshot
from tests.console.browser.test_phone import PHONE, sideways

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_admin_changes_a_rule_and_the_job_is_not_drilled_since(
    page, browser, live_console, celery_worker, scripted_agent, people, log_in
):
    install_default_pack()
    agent = scripted_agent(name="llm-70b-pretrain")
    agent.heartbeat(10)
    ana = people("ana", "vision", Role.ADMIN)
    team_id = in_thread(lambda: ana.memberships.get().team_id)
    log_in(page, "ana")
    page.goto(f"{live_console}/teams/{team_id}/rules/")
    expect(page.locator("#versions li[data-version='1']")).to_contain_text("first recorded")

    row = page.locator('#rules tr[data-rule="loss-sustained-deviation"]')
    row.locator("summary").click()
    row.locator(".rule-switch input[name=why]").fill("we pause data loading instead")
    row.locator("button:has-text('Disable')").click()
    expect(page.locator(".message.success")).to_contain_text("a new version is recorded")
    expect(row.locator(".state")).to_have_text("off")
    latest = page.locator("#versions li[data-version='2']")
    expect(latest).to_contain_text("we pause data loading instead")
    expect(latest).to_contain_text("loss-sustained-deviation: enabled True → False")
    expect(page.locator(".drill-badge")).to_contain_text(
        "not drilled since v2: loss-sustained-deviation changed (ana,"
    )
    row.locator("summary").click()  # its forms open again (the page was reloaded)
    screenshot(page, "rules.png")

    page.goto(f"{live_console}/jobs/{agent.job_id}/")
    badge = page.locator(".drill-badge.not-drilled")
    expect(badge).to_contain_text("not drilled since v2")
    badge.locator("a").click()  # "run the missing drills": the drills page, those ticked
    expect(page).to_have_url(re.compile(rf"/teams/{team_id}/drills/\?scenario="))
    expect(page.locator("#drill-form input[value=nan_loss]")).to_be_checked()

    phone = browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True)
    try:
        small = phone.new_page()
        log_in(small, "ana")
        small.goto(f"{live_console}/teams/{team_id}/rules/")
        small.locator('#rules tr[data-rule="loss-rising"] summary').click()  # an edit form open
        small.wait_for_load_state("networkidle")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        small.screenshot(path=str(SCREENSHOTS / "phone-rules.png"), full_page=True)
        assert sideways(small) == 0
        small.goto(f"{live_console}/")
        expect(small.locator(".drill-badge.not-drilled")).to_be_visible()
        assert sideways(small) == 0
    finally:
        phone.close()
