"""Every page at a 390×844 phone: nothing scrolls sideways, and the one-handed actions
(acknowledge, pause) are on the screen. Screenshots of each page land in docs/screenshots/."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from breakers.detection.rules import install_default_pack
from incidents.models import Alert, Incident, Job, Role
from tests.console.browser.conftest import SCREENSHOTS
from tests.console.browser.test_live_console import in_thread, loss

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}


def sideways(page) -> int:
    """How many CSS pixels the page is wider than the screen (0: no horizontal scroll)."""
    return page.evaluate(
        "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
        " - document.documentElement.clientWidth"
    )


def _every_page_fits(browser, page, log_in, live_console, job_id, incident_id, team_id) -> None:
    """Every page, as on-call and as an admin (who sees every form), fits a 390 px phone."""
    pages = {
        "dashboard": "/",
        "job": f"/jobs/{job_id}/",
        "alerts": "/alerts/",
        "approvals": "/approvals/",
        "incident": f"/incidents/{incident_id}/",
        "review": f"/incidents/{incident_id}/review/",
        "team-report": f"/teams/{team_id}/report/",
        "incidents": "/incidents/",
        "silences": "/silences/",
        "teams": "/teams/",
        "paging": f"/teams/{team_id}/paging/",
        "audit": "/audit/",  # on-call: the refusal page
    }
    # The admin sees every form: the paging page's policy grid, contacts and test pages,
    # the silences form, the audit trail.
    admin_pages = {
        "paging-admin": f"/teams/{team_id}/paging/",
        "silences-manager": "/silences/",
        "audit-manager": "/audit/",
    }
    wide = {}
    for name, path in pages.items():
        wide.update(measure(page, live_console + path, name))

    admin = browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True)
    try:
        admin_page = admin.new_page()
        log_in(admin_page, "ana")
        for name, path in admin_pages.items():
            wide.update(measure(admin_page, live_console + path, name))
    finally:
        admin.close()
    assert wide == {}, f"pages wider than a 390 px phone (px too wide): {wide}"


def _acknowledge_and_pause_one_handed(page, live_console, alert_id, running_job_id) -> None:
    # One-handed: the alert's Acknowledge is on the screen and works with a thumb.
    page.goto(f"{live_console}/alerts/")
    button = page.locator(f'[data-alert-id="{alert_id}"] button.act:has-text("Acknowledge")')
    assert_thumb_reachable(button.first)
    button.first.tap()
    page.locator("#act-submit").tap()
    expect(page.locator(f'[data-alert-id="{alert_id}"] .ack-by')).to_have_text("by olga")

    # … and Pause, from the dashboard's row of the running job.
    page.goto(f"{live_console}/")
    pause = page.locator(f'tr[data-job-id="{running_job_id}"] button.act:has-text("Pause")')
    assert_thumb_reachable(pause)
    pause.tap()  # one tap: no dialog
    row = page.locator(f'tr[data-job-id="{running_job_id}"] .badge')
    expect(row).to_have_text("pausing")
    assert sideways(page) == 0


def test_every_page_fits_a_phone_and_oncall_can_act_one_handed(
    browser, live_console, celery_worker, beat, scripted_agent, people, log_in
):
    install_default_pack()
    agent = scripted_agent(name="llm-70b-pretrain-with-a-long-descriptive-name")
    people("olga", "vision", Role.ONCALL)
    agent.heartbeat(199)
    agent.metrics([(s, loss(s)) for s in range(200)])
    agent.metrics([(200, "NaN")])
    command = agent.wait_for_command("checkpoint_and_pause", 200)
    agent.ack_checkpoint(command, 200)
    running = scripted_agent(name="vit-huge-finetune")
    # Its one heartbeat must outlast the screenshots of every page on a loaded machine: the Pause
    # tapped at the end is for a running job, not one the watchdog has since found silent.
    in_thread(lambda: Job.objects.filter(pk=running.job_id).update(heartbeat_timeout_seconds=3600))
    running.heartbeat(5)
    people("ana", "vision", Role.ADMIN)
    incident = in_thread(lambda: Incident.objects.get(job_id=agent.job_id))
    team_id = in_thread(lambda: incident.job.team_id)
    alert_id = in_thread(lambda: Alert.objects.filter(job_id=agent.job_id).first().pk)

    context = browser.new_context(
        viewport=PHONE, device_scale_factor=2, is_mobile=True, has_touch=True
    )
    page = context.new_page()
    try:
        log_in(page, "olga")
        _every_page_fits(browser, page, log_in, live_console, agent.job_id, incident.pk, team_id)
        _acknowledge_and_pause_one_handed(page, live_console, alert_id, running.job_id)
    finally:
        context.close()


def measure(page, url: str, name: str) -> dict[str, int]:
    page.goto(url)
    page.wait_for_load_state("networkidle")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"phone-{name}.png"), full_page=True)
    return {name: sideways(page)} if sideways(page) > 0 else {}


def assert_thumb_reachable(button) -> None:
    """Visible, inside the screen's width, and at least 44 px tall (a thumb's target)."""
    expect(button).to_be_visible()
    button.scroll_into_view_if_needed()
    box = button.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], box
    assert box["height"] >= 44, box
