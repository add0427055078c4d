"""The job page of a 1,000-rank job in Chromium at 1366×900 and on a 390 px phone: the ranks
table's counts, pages, sorts and search, and the charts' rank picker (one rank's line over the
band of every rank, never a thousand lines). Screenshots land in docs/screenshots/."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from bench._thousand import SILENT, seed_thousand
from breakers.models import MetricBlock
from incidents.models import JobRank, Role
from tests.console.browser.conftest import SCREENSHOTS
from tests.console.browser.test_live_console import in_thread
from tests.console.browser.test_phone import PHONE, sideways

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

KINDS = "BrakelineCharts.state.charts.loss.g.meta.map(function (m) { return m.kind; })"
LOSS = 'figure[data-group="loss"]'
VIEWS = {
    "desktop": {"viewport": {"width": 1366, "height": 900}},
    "phone": {"viewport": PHONE, "device_scale_factor": 2, "is_mobile": True},
}


def first_rank(page) -> str | None:
    return page.locator("#ranks tbody tr").first.get_attribute("data-rank")


def pages_sorts_and_searches(page) -> None:
    ranks = page.locator("#ranks")
    expect(ranks.locator("#ranks-counts")).to_have_text("1,000 ranks · 7 silent · 2 stragglers")
    expect(ranks.locator("tbody tr")).to_have_count(50)
    assert first_rank(page) == str(SILENT[0])
    page.locator("#ranks a[rel=next]").first.click()
    expect(page.locator("#ranks .shown").first).to_have_text("51–100 of 1,000 · page 2 of 20")
    assert first_rank(page) == "44"  # past the 7 silent and ranks 0–43 (12 among the silent)
    page.select_option("#ranks select[name=sort]", "slowest")
    expect(page.locator("#ranks .shown").first).to_contain_text("page 1 of 20")
    assert first_rank(page) == "77"
    page.fill("#ranks input[name=q]", "713")
    page.press("#ranks input[name=q]", "Enter")
    expect(page.locator("#ranks tbody tr")).to_have_count(1)
    expect(page.locator('#ranks tr[data-rank="713"]')).to_contain_text("silent")


def picks_a_rank(page) -> None:
    page.evaluate("BrakelineCharts.ready")
    figure = page.locator(LOSS)
    expect(figure).to_have_attribute("data-rank", "0")
    page.click('#ranks a.pick-rank[data-rank="713"]')
    expect(figure).to_have_attribute("data-rank", "713")
    expect(figure.locator(".u-legend")).to_contain_text("loss · rank 713")
    kinds = page.evaluate(KINDS)
    assert kinds.count("value") == 1 and {"ranks-low", "ranks-high"} <= set(kinds)
    assert len(kinds) < 10  # one rank's line and the band (and the rule's), never 1,000
    page.fill("#rank-pick", "998")  # it logged no loss at all: the band of the others
    page.press("#rank-pick", "Enter")
    expect(figure).to_have_attribute("data-rank", "998")
    expect(figure.locator(".u-legend")).to_contain_text("loss · rank 998")
    assert {"ranks-low", "ranks-high"} <= set(page.evaluate(KINDS))
    page.fill("#rank-pick", "5")
    page.press("#rank-pick", "Enter")
    expect(figure).to_have_attribute("data-rank", "5")


def stays_live(page, job_id: int) -> None:
    """Rank 5 falls silent while the page is open: the table says so by itself."""
    expect(page.locator("#ranks-counts")).to_contain_text("· 7 silent ·")
    in_thread(_silence, job_id, 5)
    expect(page.locator("#ranks-counts")).to_contain_text("· 8 silent ·", timeout=30_000)
    expect(page.locator('#ranks tr[data-rank="5"]')).to_contain_text("silent")
    in_thread(_silence, job_id, 5, back=True)
    expect(page.locator("#ranks-counts")).to_contain_text("· 7 silent ·", timeout=30_000)


def _silence(job_id: int, rank: int, back: bool = False) -> None:
    deadline = timezone.now() + timedelta(seconds=600 if back else -1)
    JobRank.objects.filter(job_id=job_id, rank=rank).update(heartbeat_deadline=deadline)


def _forget_points(job_id: int, rank: int) -> None:
    MetricBlock.objects.filter(job_id=job_id, rank=rank).delete()


def test_the_job_page_of_a_thousand_ranks_pages_its_table_and_picks_a_rank(
    browser, live_console, people, log_in
):
    seeded = in_thread(seed_thousand, "vision", "llm-1k", steps=120)
    in_thread(_forget_points, seeded.job_id, 998)
    people("olga", "vision", Role.VIEWER)
    for name, options in VIEWS.items():
        context = browser.new_context(**options)
        page = context.new_page()
        try:
            log_in(page, "olga")
            page.goto(f"{live_console}/jobs/{seeded.job_id}/")
            if name == "desktop":
                stays_live(page, seeded.job_id)
            pages_sorts_and_searches(page)
            picks_a_rank(page)
            if name == "phone":
                assert sideways(page) == 0
            page.fill("#ranks input[name=q]", "")
            page.select_option("#ranks select[name=sort]", "silent")
            expect(page.locator("#ranks tbody tr")).to_have_count(50)
            expect(page.locator("#ranks tbody tr").first).to_have_attribute("data-rank", "12")
            page.evaluate("document.getElementById('ranks').scrollIntoView()")
            page.screenshot(path=str(SCREENSHOTS / f"{name}-job-1000-ranks-table.png"))
            page.evaluate("document.getElementById('charts').scrollIntoView()")
            page.screenshot(path=str(SCREENSHOTS / f"{name}-job-1000-ranks-chart.png"))
        finally:
            context.close()
