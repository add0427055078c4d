"""The ranks table of the job page, in Chromium at desktop and 390 px phone, fed by real
per-rank HTTP heartbeats; screenshots land in docs/screenshots/."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from incidents.models import JobRank, Role
from tests.console.browser.conftest import SCREENSHOTS
from tests.console.browser.test_live_console import in_thread
from tests.console.browser.test_phone import PHONE, sideways

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _silence_rank(job_id: int, rank: int) -> None:
    """Rank ``rank`` last heartbeated a minute ago (the live server's clock is not ours to
    travel): its deadline is past."""
    past = timezone.now() - timedelta(seconds=60)
    JobRank.objects.filter(job_id=job_id, rank=rank).update(
        last_heartbeat_at=past, heartbeat_deadline=past + timedelta(seconds=10)
    )


def test_the_job_page_lists_its_ranks_and_marks_the_silent_one(
    browser, live_console, beat, scripted_agent, people, log_in
):
    agent = scripted_agent(name="gpt-ddp-4x")
    people("olga", "vision", Role.ONCALL)
    for rank in range(3):  # rank 3 of 4 never heartbeats
        body = {"step": 120 + rank, "status": "running", "rank": rank, "world_size": 4}
        body |= {"pid": 31000 + rank, "hostname": f"gpu-node-{rank // 2:02d}"}
        agent.post("/api/v1/agent/heartbeat", body)
    in_thread(_silence_rank, agent.job_id, 2)
    for name, options in {
        "desktop": {"viewport": {"width": 1280, "height": 900}},
        "phone": {"viewport": PHONE, "device_scale_factor": 2, "is_mobile": True},
    }.items():
        context = browser.new_context(**options)
        page = context.new_page()
        try:
            log_in(page, "olga")
            page.goto(f"{live_console}/jobs/{agent.job_id}/")
            ranks = page.locator("#ranks")
            expect(ranks).to_contain_text("3 of 4 ranks reported · 1 silent · 0 stragglers")
            expect(ranks).to_contain_text("never heard from: 3")
            expect(ranks.locator("tbody tr")).to_have_count(3)
            expect(ranks.locator('tr[data-rank="2"]')).to_contain_text("silent")
            expect(ranks.locator('tr[data-rank="1"]')).to_contain_text("31001")
            expect(ranks.locator('tr[data-rank="0"]')).not_to_contain_text("silent")
            if name == "phone":
                assert sideways(page) == 0
            ranks.scroll_into_view_if_needed()
            ranks.screenshot(path=str(SCREENSHOTS / f"{name}-job-ranks.png"))
        finally:
            context.close()
