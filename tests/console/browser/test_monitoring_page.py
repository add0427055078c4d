"""The Monitoring page as an on-call sees it: unrouted outside alerts first, then the routed
ones, at desktop width and on a 390 px phone (screenshots in docs/screenshots/)."""

from __future__ import annotations

import json
import urllib.request

import pytest
from playwright.sync_api import expect

from breakers.models import IntegrationToken
from incidents.models import Job, Node, Role, Team
from tests.breakers.monitoring.test_alertmanager_receiver import alert, webhook
from tests.console.browser.conftest import SCREENSHOTS
from tests.console.browser.test_live_console import in_thread
from tests.console.browser.test_phone import PHONE, sideways

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_monitoring_page_shows_unrouted_and_routed_alerts(
    browser, page, live_console, beat, make_agent, people, log_in
):
    def set_up() -> str:
        agent = make_agent(team="vision", name="llm-70b-pretrain")
        Job.objects.filter(pk=agent.job_id).update(status="running", current_step=48_200)
        Node.objects.create(job_id=agent.job_id, hostname="gpu-b")
        return IntegrationToken.issue(Team.objects.get(name="vision"), "alertmanager")[1]

    token = in_thread(set_up)
    people("olga", "vision", Role.ONCALL)
    alerts = [alert("gpu-b", gpu) for gpu in range(8)]
    alerts += [alert("gpu-017", 3, xid="13"), alert("gpu-042", 0, xid="94")]
    request = urllib.request.Request(
        f"{live_console}/api/v1/integrations/alertmanager",
        data=json.dumps(webhook(alerts)).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.loads(response.read())["unrouted"] == 2

    log_in(page, "olga")
    page.goto(f"{live_console}/monitoring/")
    expect(page.locator("#unrouted-alerts tbody tr")).to_have_count(2)
    expect(page.locator("#routed-alerts tbody tr")).to_have_count(1)  # 8 GPUs, one alert
    expect(page.locator("#routed-alerts")).to_contain_text("GPU 0, 1, 2, 3, 4, 5, 6, 7")
    expect(page.locator("#routed-alerts")).to_contain_text("8 of 8")
    expect(page.locator("#unrouted-alerts")).to_contain_text("no running job of the team on node")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "monitoring.png"), full_page=True)

    context = browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True)
    phone = context.new_page()
    try:
        log_in(phone, "olga")
        phone.goto(f"{live_console}/monitoring/")
        phone.wait_for_load_state("networkidle")
        phone.screenshot(path=str(SCREENSHOTS / "phone-monitoring.png"), full_page=True)
        assert sideways(phone) == 0
    finally:
        context.close()
