"""A shadow rule on the rules page in Chromium: a loader counter posted by a scripted agent is
evaluated by the real worker; the page shows what the shadow rule would have done (one event,
on a job with no incident: outside), fits a 390 px phone, and an admin promotes it to live with
a reason — a new version whose diff says so."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from breakers.detection import rulesets
from breakers.detection.rules import install_default_pack
from breakers.models import ShadowFiring
from incidents.models import Role
from tests.breakers.shadow.test_shadow_pages import RULE
from tests.console.browser.test_live_console import in_thread
from tests.console.browser.test_phone import PHONE, sideways
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_admin_reads_the_shadow_figures_and_promotes_the_rule(
    page, live_console, celery_worker, scripted_agent, people, log_in
):
    install_default_pack()
    agent = scripted_agent(name="llm-shadow")
    ana = people("ana", "vision", Role.ADMIN)
    team_id = in_thread(lambda: ana.memberships.get().team_id)
    change = [{"op": "create", "key": "bad-batches", "fields": RULE}]
    in_thread(lambda: rulesets.change_rules(ana, team_id, "watch the loader first", change))
    agent.metrics([(5, 1.0)], name="data.bad_batches")
    wait_for(
        lambda: in_thread(lambda: ShadowFiring.objects.filter(job_id=agent.job_id).exists()),
        "the would-have-fired record",
    )
    log_in(page, "ana")
    page.goto(f"{live_console}/teams/{team_id}/rules/")
    row = page.locator('#shadow-rules tr[data-shadow-rule="bad-batches"]')
    # One event, on a job with no incident: outside every incident, none caught.
    figures = {"fired": "1", "outside": "1", "caught": "0 of 0", "per job": "llm-shadow: 1"}
    for label, text in figures.items():
        expect(row.locator(f"[data-label='{label}']")).to_have_text(text)
    expect(page.locator('#rules tr[data-rule="bad-batches"] .state')).to_contain_text("shadow")

    page.set_viewport_size(PHONE)  # the same page on a phone's width
    page.reload()
    expect(page.locator("#shadow-rules")).to_be_visible()
    assert sideways(page) == 0
    page.set_viewport_size({"width": 1366, "height": 900})

    row.locator("input[name=why]").fill("one bad batch, caught where the loss saw nothing")
    row.locator("button:has-text('Promote to live')").click()
    expect(page.locator(".message.success")).to_contain_text("Rule promoted to live")
    expect(page.locator('#rules tr[data-rule="bad-batches"] .state')).to_have_text("on")
    latest = page.locator("#versions li").first
    expect(latest).to_contain_text("one bad batch, caught where the loss saw nothing")
    expect(latest).to_contain_text("bad-batches: shadow True → False")
    # Its evidence stays on the page, marked live now, with no form to promote it again.
    expect(row).to_contain_text("(live now)")
    expect(row.locator("button")).to_have_count(0)
