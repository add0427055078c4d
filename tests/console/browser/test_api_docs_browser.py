"""The API docs page (Swagger UI) in Chromium: it renders the schema's operations, and the
page's Content-Security-Policy refuses nothing it needs (no CSP error in the console)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_api_docs_render_without_a_policy_error(page, live_console):
    messages: list[str] = []
    page.on("console", lambda message: messages.append(f"{message.type}: {message.text}"))
    page.goto(f"{live_console}/api/docs/")
    expect(page.locator(".opblock-summary-path").first).to_be_visible()
    expect(page.get_by_text("/api/v1/agent/metrics").first).to_be_visible()
    page.wait_for_load_state("networkidle")
    refused = [m for m in messages if "Content Security Policy" in m]
    assert refused == [], refused
