"""The review page in a real Chromium against Daphne: it renders, the slowest link stands out,
and printing drops the console's chrome. Saves a screenshot (``BRAKELINE_SCREENSHOT_DIR``).

Playwright runs in a child process: its sync API leaves an asyncio loop on the thread that
used it, which would break the async tests that run after this one in the same process. For
the same reason this test is not marked ``browser``: the tests so marked run last, after a
loop was left behind, where this test's own setup (channel-layer publishing after commit,
through async_to_sync) could not run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

SCRIPT = r"""
import json, sys
from playwright.sync_api import sync_playwright

url, session, shot, chromium = sys.argv[1:5]
args = sys.argv[5:]
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=chromium, args=args)
    context = browser.new_context(viewport={"width": 1440, "height": 1250})
    context.add_cookies([{"name": "sessionid", "value": session, "url": url}])
    page = context.new_page()
    page.goto(url)
    page.wait_for_selector("#chain")
    facts = {
        "bars": page.locator("#chain tr.link").count(),
        "slowest": page.locator("#chain tr.slowest").get_attribute("data-link"),
        "slowest_width": page.locator("#chain tr.slowest .bar").evaluate(
            "el => el.getBoundingClientRect().width"),
        "brake_width": page.locator("#chain tr[data-link=brake] .bar").evaluate(
            "el => el.getBoundingClientRect().width"),
        "rows": page.locator("#timeline tr.row").count(),
        "curve_points": page.locator("#curve polyline").evaluate_all(
            "els => els.reduce((n, el) => n + el.points.numberOfItems, 0)"),
        "curve_height": page.locator("#curve").evaluate("el => el.getBoundingClientRect().height"),
    }
    page.screenshot(path=shot)  # the first screen: chain, timeline, curve
    page.emulate_media(media="print")
    facts["print_topbar"] = page.locator(".topbar").is_visible()
    facts["print_form"] = page.locator("#edit-review").is_visible()
    facts["print_writeup"] = page.locator("#text-summary").is_visible()
    browser.close()
print(json.dumps(facts))
"""


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's Chromium")
@pytest.mark.django_db(transaction=True)
def test_the_review_page_in_chromium(live_console, flow, tmp_path):
    client = Client()
    client.force_login(flow.team.person("oncall"))
    shot = Path(os.environ.get("BRAKELINE_SCREENSHOT_DIR") or tmp_path) / "review.png"
    url = f"{live_console}/incidents/{flow.incident_id}/review/"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            SCRIPT,
            url,
            client.cookies["sessionid"].value,
            str(shot),
            CHROMIUM,
            *ARGS,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts["bars"] == 6 and facts["slowest"] == "recover"
    # recover (82 s) is the full bar; brake (8 s) about a tenth of it.
    assert facts["brake_width"] == pytest.approx(facts["slowest_width"] * 8 / 82, rel=0.05)
    assert facts["rows"] == 12 and facts["curve_points"] > 50 and facts["curve_height"] > 100
    assert (facts["print_topbar"], facts["print_form"], facts["print_writeup"]) == (
        False,
        False,
        True,
    )
    assert shot.stat().st_size > 10_000
