"""The drill scorecard pages in Chromium: a team's drills (last pass per scenario, the time to
brake trend, the admin's form) and one drill's scorecard, at a desktop and at a 390 px phone
(no sideways scroll). Screenshots land in docs/screenshots/ (drills-*.png).

The drills shown are judged by the real services (``breakers.drills.runs``) from scorecard
lines like the runner's; the runner itself runs end to end in tests/breakers/drills/.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from playwright.sync_api import expect

from breakers.drills import runs
from breakers.drills.scorecard import Line
from incidents.models import Role, Team
from tests.console.browser.conftest import SCREENSHOTS
from tests.console.browser.test_live_console import in_thread
from tests.console.browser.test_phone import PHONE, sideways

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
OWN_SCRIPT = Path(__file__).parents[2] / "breakers" / "drills" / "scripts" / "own_train.py"


def lines(loads: bool, brake_s: float) -> list[Line]:
    loaded = (
        Line(
            "checkpoint loads",
            True,
            "restored step 48, one step ran (loss 0.1638)",
            "restored in a fresh process, SHA-256 verified, one step runs",
        )
        if loads
        else Line(
            "checkpoint loads",
            False,
            "did not load: ValueError: checkpoint "
            "step-00000048.pt does not match the expected sha256",
            "restored in a fresh process, SHA-256 verified, one step runs",
        )
    )
    return [
        Line("breaker fired", True, "L3 by non-finite-loss-or-gradients", "L3 by …"),
        Line("time to detect", True, "0.25 s, 0 steps", "≤ 10.0 s and ≤ 3 steps"),
        Line(
            "time to brake",
            True,
            f"{brake_s:.2f} s, 0 steps (checkpoint_and_pause succeeded)",
            "braked ≤ 25.0 s after the fault",
        ),
        Line("checkpoint saved", True, "step 48 (brake), in the catalogue", "in the catalogue"),
        loaded,
        Line("release", True, "job paused, process alive, release hook ran", "paused"),
        Line("paged", True, "chat, phone to alice", "chat, phone to alice, marked DRILL"),
    ]


def judged(team: Team, scenario: str, loads: bool, brake_s: float):
    (run,) = runs.request_drills(team, [scenario], launch=False)
    runs.start(run)
    return runs.finish(run, lines(loads, brake_s), brake_seconds=brake_s, detect_seconds=0.25)


def _the_teams_own_command(page) -> None:
    """A relative program is refused naming the field, an absolute one is saved and offered as
    the drill's workload."""
    form = page.locator("#workload-form")
    form.locator("input[name=command]").fill("train.py --drill")
    form.locator("button").click()
    expect(page.locator(".message.error")).to_contain_text("(command: the program as an absolute")
    expect(page.locator("#drill-form input[value=team]")).to_have_count(0)
    form.locator("input[name=command]").fill(f"{sys.executable} {OWN_SCRIPT}")
    form.locator("input[name=verify_command]").fill(f"{sys.executable} {OWN_SCRIPT} --verify -")
    form.locator("button").click()
    expect(page.locator(".message.success")).to_contain_text("drill workload is saved")
    expect(page.locator("#drill-form input[value=team]")).to_have_count(1)
    expect(form.locator("input[name=command]")).to_have_value(f"{sys.executable} {OWN_SCRIPT}")


def test_the_scorecard_pages_at_a_desk_and_on_a_phone(
    browser, page, live_console, beat, people, log_in
):
    people("ada", "research", Role.ADMIN)
    team = in_thread(lambda: Team.objects.get(name="research"))
    for brake_s in (0.9, 0.6, 1.4):
        in_thread(judged, team, "nan_loss", True, brake_s)
    failed = in_thread(judged, team, "xid", False, 1.1)

    log_in(page, "ada")
    page.goto(f"{live_console}/teams/{team.pk}/drills/")
    nan_row = page.locator('#drill-scenarios tr[data-scenario="nan_loss"]')
    expect(nan_row.locator(".badge")).to_have_text("passed")
    expect(nan_row.locator('[data-label="time to brake"]')).to_have_text("1.40 s")
    expect(page.locator('#drill-scenarios tr[data-scenario="xid"] .badge')).to_have_text("failed")
    expect(page.locator('#drill-scenarios tr[data-scenario="hang"]')).to_contain_text(
        "never drilled"
    )
    expect(page.locator("#brake-trend polyline")).to_have_count(1)
    expect(page.locator("#drill-form button")).to_have_text("Run the drill set")
    _the_teams_own_command(page)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "drills-team-desktop.png"), full_page=True)

    page.locator('#drill-scenarios tr[data-scenario="xid"] a').first.click()
    page.wait_for_url(f"{live_console}/drills/{failed.pk}/")
    expect(page.locator("#drill-status")).to_have_text("failed")
    loads = page.locator('#scorecard tr[data-check="checkpoint loads"]')
    expect(loads.locator(".badge")).to_have_text("FAIL")
    expect(loads).to_contain_text("does not match the expected sha256")
    expect(page.locator("#scorecard tr.pass")).to_have_count(6)
    page.screenshot(path=str(SCREENSHOTS / "drills-scorecard-desktop.png"), full_page=True)

    phone = browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True)
    try:
        small = phone.new_page()
        log_in(small, "ada")
        wide = {}
        for name, path in (
            ("team", f"/teams/{team.pk}/drills/"),
            ("scorecard", f"/drills/{failed.pk}/"),
        ):
            small.goto(live_console + path)
            small.wait_for_load_state("networkidle")
            small.screenshot(path=str(SCREENSHOTS / f"phone-drills-{name}.png"), full_page=True)
            if sideways(small) > 0:
                wide[name] = sideways(small)
        assert wide == {}, f"drill pages wider than a 390 px phone: {wide}"
    finally:
        phone.close()
