"""Fixes from a UI sweep at a 1366 px desktop and a 390 px phone, checked without a browser:
the production 404 and 500 pages, the escalation dialog's "lower the learning rate" choice
(it carries the factor the API needs), labels of phone cards, the drills trend's dots, and
the login form keeping the username after a wrong password. The layout itself is checked in
Chromium: tests/console/browser/test_ui_sweep_browser.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.test import Client, override_settings

from incidents.models import Role
from incidents.reviews.durations import LINK_KEYS
from tests.support.review import raise_alert

ROOT = Path(__file__).resolve().parents[2]
VIEWPORT = '<meta name="viewport" content="width=device-width, initial-scale=1">'


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
@override_settings(DEBUG=False)
def test_the_production_404_is_the_consoles_page_with_a_way_back(team):
    client = logged_in(team.person("viewer"))
    response = client.get("/no-such-page/<script>/")
    assert response.status_code == 404
    html = response.content.decode()
    assert VIEWPORT in html and "console/app.css" in html
    assert "<h1>Not found</h1>" in html and 'href="/">Back to Jobs</a>' in html
    assert "<script>/" not in html  # the path is shown escaped
    assert '<a href="/alerts/">Alerts</a>' in html  # the frame's navigation, logged in


@pytest.mark.django_db
@override_settings(DEBUG=False)
def test_the_404_for_someone_logged_out_has_no_navigation():
    response = Client().get("/teams/999999/nowhere/")
    assert response.status_code == 404
    html = response.content.decode()
    assert VIEWPORT in html and "Back to Jobs" in html and "<nav>" not in html


@pytest.mark.django_db
@override_settings(DEBUG=False)
def test_the_500_page_needs_no_request_and_no_database(rf, django_assert_num_queries):
    from console.api.errors import server_error

    with django_assert_num_queries(0):
        response = server_error(rf.get("/"))
    assert response.status_code == 500
    html = response.content.decode()
    assert VIEWPORT in html and "console/app.css" in html
    assert "Something went wrong" in html and 'href="/">Back to Jobs</a>' in html


@pytest.mark.django_db
def test_lower_the_learning_rate_sends_its_factor_and_the_api_takes_it(team):
    from console.board import alert_buttons
    from incidents.models import EscalationRequest

    oncall = team.person("oncall")
    alert = raise_alert(team.job_id, "L2")
    button = next(b for b in alert_buttons(Role.ONCALL, alert) if b.label == "Request escalation")
    kind = next(f for f in button.ask if f["name"] == "command.kind")
    chosen = next(c for c in kind["choices"] if c[0] == "lower_lr")
    assert chosen[2] == {"command": {"params": {"factor": 0.5}}}
    assert all(len(c) == 2 for c in kind["choices"] if c[0] != "lower_lr")  # no params: refused
    # What live.js sends: the button's body, the asked fields, the chosen option's body merged.
    body = {**button.body, "command": {"kind": "lower_lr", **chosen[2]["command"]}}
    body["reason"] = "loss deviating, lower the LR"
    response = logged_in(oncall).post(button.url, json.dumps(body), "application/json")
    assert response.status_code == 201, response.content
    assert EscalationRequest.objects.get().command_params == {"factor": 0.5}


def test_live_js_merges_the_chosen_option_and_reads_out_refused_fields():
    js = (ROOT / "console/static/console/live.js").read_text()
    assert "option.dataset.body" in js and "merge(body, JSON.parse(option.dataset.body))" in js
    assert "JSON.stringify(answer.fields)" not in js  # {} or {"params.factor": …} as text
    assert 'key + ": "' in js


@pytest.mark.django_db
def test_the_login_form_keeps_the_username_after_a_wrong_password():
    response = Client().post("/login/", {"username": "olga", "password": "wrong"})
    assert response.status_code == 200
    html = response.content.decode()
    assert "didn&#x27;t match" in html or "didn't match" in html
    assert re.search(r'<input name="username" value="olga"', html)


@pytest.mark.django_db
def test_phone_cards_say_what_each_cell_is(flow):
    client = logged_in(flow.team.person("manager"))
    teams = client.get("/teams/").content.decode()
    assert 'data-label="an L3 pages"' in teams
    url = f"/teams/{flow.team.team.pk}/report/"
    report = client.get(url, {"since": "2026-03-01", "until": "2026-03-03"}).content.decode()
    incidents = report[report.index('id="incidents"') :]
    for key in ("job", "opened", "status"):
        assert f'data-label="{key}"' in incidents, key
    # Its link cells are labelled by review.css, column by column (after the five above).
    css = (ROOT / "console/static/console/review.css").read_text()
    labels = re.findall(r'#incidents td:nth-child\((\d+)\)::before \{ content: "(\w+) "', css)
    assert [(int(n) - 6, key) for n, key in labels] == list(enumerate(LINK_KEYS))
    review = client.get(f"/incidents/{flow.incident_id}/review/").content.decode()
    for label, aria in (("done", "done"), ("follow-up", ""), ("owner", "owner"), ("due", "due")):
        assert f'<td data-label="{label}">' in review
        assert f'aria-label="follow-up 1{" " + aria if aria else ""}"' in review
    snapshots = (ROOT / "templates/snapshots/job_snapshots.html").read_text()
    assert 'data-label="a (from)"' in snapshots and 'data-label="b (to)"' in snapshots


@pytest.mark.django_db
def test_the_drills_trend_draws_a_dot_per_drill_even_for_one(team):
    from django.utils import timezone

    from breakers.models.drills import DrillRun

    admin = team.person("admin")
    url = f"/teams/{team.team.pk}/drills/"
    DrillRun.objects.create(
        team=team.team,
        scenario="nan_loss",
        status="failed",
        finished_at=timezone.now(),
        detect_seconds=0.09,
        brake_seconds=0.2234,
    )
    html = logged_in(admin).get(url).content.decode()
    trend = html[html.index('id="brake-trend"') :]
    trend = trend[: trend.index("</section>")]
    dots = re.findall(r'<path d="M([\d.]+) ([\d.]+)h0"', trend)
    assert dots == [("160", "52")]  # one drill: in the middle, at the top (it is the highest)
    assert "Highest 0.22 s · nan_loss 0.22 s" in trend  # one number format
    DrillRun.objects.create(
        team=team.team,
        scenario="inf_loss",
        status="passed",
        finished_at=timezone.now(),
        detect_seconds=0.1,
        brake_seconds=0.6,
    )
    html = logged_in(admin).get(url).content.decode()
    trend = html[html.index('id="brake-trend"') :]
    dots = re.findall(r'<path d="M([\d.]+) ([\d.]+)h0"', trend[: trend.index("</section>")])
    assert [x for x, _ in dots] == ["0", "320"] and dots[1][1] == "52"


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("pause_data", "Pause data loading"),
        ("lower_lr", "Lower the learning rate"),
        ("isolate_node", "Isolate node"),
        ("something_new", "something_new"),
    ],
)
def test_a_requested_command_is_named_in_words_from_the_control_planes_labels(kind, words):
    from django.template.loader import render_to_string

    html = render_to_string("partials/command_kind.html", {"kind": kind})
    assert f"<b>{words}</b>" in html and f'<code class="muted">{kind}</code>' in html
