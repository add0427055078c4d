"""The job page's loss chart of a 3-rank job in Chromium: rank 0's line inside the min/max band
of every rank (rank 1's spike on its edge), then a line per rank; a screenshot lands in
docs/screenshots/."""

from __future__ import annotations

import math

import pytest
from playwright.sync_api import expect

from incidents.models import Role
from tests.console.browser.conftest import SCREENSHOTS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

KINDS = (
    "BrakelineCharts.state.charts.loss.g.meta.map(function (m) { return m.kind + (m.rank || ''); })"
)


def test_the_loss_chart_shows_rank_0_in_the_band_of_every_rank_then_a_line_per_rank(
    browser, live_console, scripted_agent, people, log_in
):
    agent = scripted_agent(name="ddp-3x")
    people("olga", "vision", Role.VIEWER)
    for rank in range(3):
        beat = {"step": 0, "status": "running", "rank": rank, "world_size": 3}
        agent.post("/api/v1/agent/heartbeat", beat | {"hostname": f"gpu-{rank}"})
        points = [
            {
                "name": "loss",
                "step": s,
                "value": 4.0
                if (rank, s) == (1, 120)
                else 2.0 + math.sin(s / 20) * 0.1 + rank * 0.05,
            }
            for s in range(300)
        ]
        agent.post("/api/v1/agent/metrics", {"rank": rank, "points": points})
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        log_in(page, "olga")
        page.goto(f"{live_console}/jobs/{agent.job_id}/")
        page.evaluate("BrakelineCharts.ready")
        kinds = page.evaluate(KINDS)
        assert {"value", "ranks-low", "ranks-high"} <= set(kinds) and "rank1" not in kinds
        high = page.evaluate(
            "(function () { const g = BrakelineCharts.state.charts.loss.g;"
            " const c = g.meta.findIndex(function (m) { return m.kind === 'ranks-high'; });"
            " const col = g.raw[c + 1].filter(function (v) { return v != null; });"
            " return Math.max.apply(null, col); })()"
        )
        assert high == 4.0  # rank 1's one-step spike is the band's edge, not averaged away
        figure = page.locator('figure[data-group="loss"]')
        figure.screenshot(path=str(SCREENSHOTS / "desktop-job-rank-band.png"))
        page.select_option("#rank-view", "lines")
        page.wait_for_function(f"() => {KINDS}.indexOf('rank2') >= 0")
        kinds = page.evaluate(KINDS)
        assert {"rank1", "rank2"} <= set(kinds) and "ranks-low" not in kinds
        expect(figure.locator(".u-legend")).to_contain_text("loss · rank 2")
    finally:
        context.close()
