"""Layout fixes from a UI sweep, measured in Chromium: the rules page's cards take a 390 px
phone's width (the desktop column widths no longer squeeze them), the review timeline fits its
column at a 1366 px desktop although a checkpoint's SHA-256 is one 64-character word, the
review's save buttons keep their words whole on a phone, and a chart with a single point shows
it, centred on its step. No screenshot is written."""

from __future__ import annotations

import pytest
from django.test import Client
from playwright.sync_api import expect

from breakers.detection.rules import install_default_pack
from incidents.models import Role
from tests.console.browser.test_live_console import in_thread
from tests.console.browser.test_phone import PHONE, sideways
from tests.support.review import run_flow

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DESKTOP = {"width": 1366, "height": 850}


def signed_in(browser, live_console, user, viewport, **options):
    client = Client()
    client.force_login(user)
    context = browser.new_context(viewport=viewport, **options)
    context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_console}]
    )
    return context


def width(locator) -> float:
    return locator.evaluate("el => el.getBoundingClientRect().width")


def test_the_rules_cards_and_their_edit_forms_take_the_phone_width(browser, live_console, people):
    in_thread(install_default_pack)
    ana = people("ana", "vision", Role.ADMIN)
    team_id = in_thread(lambda: ana.memberships.get().team_id)
    context = signed_in(browser, live_console, ana, PHONE, is_mobile=True, has_touch=True)
    try:
        page = context.new_page()
        page.goto(f"{live_console}/teams/{team_id}/rules/")
        row = page.locator("#rules tbody tr").first
        expect(row).to_be_visible()
        assert width(row.locator("td").first) > 250  # was 106 px: 30 % of the card
        for label in ("watches", "detector"):
            assert width(row.locator(f'td[data-label="{label}"]')) < 360  # a cell, not a column
        row.locator("summary").click()
        form = row.locator("form.rule-form")
        expect(form).to_be_visible()
        assert width(form) > 300  # was 99 px
        assert width(row.locator("form.rule-form textarea[name=params]")) > 250
        assert sideways(page) == 0
    finally:
        context.close()


def test_the_review_timeline_fits_its_column_and_the_buttons_keep_their_words(
    browser, live_console, team
):
    flow = in_thread(run_flow, team)
    oncall = in_thread(lambda: team.person("oncall"))
    url = f"{live_console}/incidents/{flow.incident_id}/review/"
    desktop = signed_in(browser, live_console, oncall, DESKTOP)
    try:
        page = desktop.new_page()
        page.goto(url)
        timeline = page.locator("#timeline")
        expect(timeline).to_contain_text("ab" * 32)  # the checkpoint's SHA-256, one word
        fit = timeline.evaluate(
            "el => ({scroll: el.scrollWidth, client: el.clientWidth,"
            " right: el.getBoundingClientRect().right,"
            " column: el.parentElement.getBoundingClientRect().right})"
        )
        assert fit["scroll"] <= fit["client"] and fit["right"] <= fit["column"] + 1, fit
        assert sideways(page) == 0
    finally:
        desktop.close()
    phone = signed_in(browser, live_console, oncall, PHONE, is_mobile=True)
    try:
        page = phone.new_page()
        page.goto(url)
        buttons = page.locator("form.edit .buttons button")
        expect(buttons.first).to_be_visible()
        for i in range(buttons.count()):
            box = buttons.nth(i).evaluate(
                "el => ({h: el.getBoundingClientRect().height,"
                " line: parseFloat(getComputedStyle(el).lineHeight) || 22,"
                " text: el.innerText})"
            )
            assert box["h"] < 44 + box["line"], box  # one line of text: no word broken
        assert sideways(page) == 0
    finally:
        phone.close()


def test_a_chart_of_one_point_shows_it_centred_on_its_step(
    browser, live_console, scripted_agent, people
):
    agent = scripted_agent(name="fresh-job")
    agent.metrics([(100, 2.5)])
    agent.heartbeat(100)
    olga = people("olga", "vision", Role.ONCALL)
    for viewport in (DESKTOP, PHONE):
        context = signed_in(browser, live_console, olga, viewport)
        try:
            page = context.new_page()
            page.goto(f"{live_console}/jobs/{agent.job_id}/")
            expect(page.locator('figure.chart[data-group="loss"]')).to_have_attribute(
                "data-points", "1"
            )
            chart = page.evaluate(
                """() => { const u = BrakelineCharts.state.charts.loss.plot;
                  return {shown: u.series[1].points.show(u, 1), min: u.scales.x.min,
                          max: u.scales.x.max, x: u.valToPos(100, "x"), w: u.bbox.width}; }"""
            )
            assert chart["shown"] is True, chart  # a dot: one point draws no line
            # Centred on step 100, a few steps either side (uPlot ran it from 0 to 200).
            assert 90 <= chart["min"] < 100 < chart["max"] <= 110, chart
            assert abs(chart["x"] * 2 - chart["w"] / page.evaluate("devicePixelRatio")) < 8
        finally:
            context.close()
