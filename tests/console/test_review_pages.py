"""The review page and the team report page: what they show, the write-up form, print CSS; and
the curve's SVG geometry (pure)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import Client

from incidents.models import Incident, Review, ReviewRevision

ROOT = Path(__file__).resolve().parents[2]


def page(client: Client, incident_id: int) -> str:
    response = client.get(f"/incidents/{incident_id}/review/")
    assert response.status_code == 200
    return response.content.decode()


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_the_page_shows_the_chain_the_timeline_and_the_curve(flow):
    html = page(logged_in(flow.team.person("viewer")), flow.incident_id)
    # The chain: one bar per link, the slowest (recover, 82 s) marked, the unmeasured greyed.
    links = re.findall(r'<tr class="link([^"]*)" data-link="(\w+)">', html)
    keys = ["detect", "notify", "acknowledge", "escalate", "brake", "recover"]
    assert [key for _, key in links] == keys
    assert dict((key, classes.strip()) for classes, key in links) == {
        "detect": "",
        "notify": "unmeasured",
        "acknowledge": "",
        "escalate": "",
        "brake": "",
        "recover": "slowest",
    }
    assert 'style="width: 100.0%"' in html and "1 min 22 s" in html and "8 s" in html
    # Each link names the events it runs between, timed from the first anomalous point.
    assert "first anomalous point (+0 ms) → alert raised (+3 s)" in html
    assert '<strong id="accelerator-hours">0.10 (32 accelerators, declared)</strong>' in html
    # Every timeline row, in order, with its actor.
    kinds = re.findall(r'<tr class="row kind-\w+" data-kind="(\w+)">', html)
    assert kinds[:3] == ["first_anomalous_point", "alert_raised", "command_issued"]
    assert len(kinds) == 12 and kinds[-1] == "incident_resolved"
    assert '<span class="actor actor-person">' + flow.team.person("oncall").username in html
    assert '<span class="actor actor-agent">the training process</span>' in html
    # The loss around the episode, with the NaN marked and the chain's events as lines.
    # (Drawn twice: for a wide screen and for a phone; CSS shows one.)
    curve = html[html.index('<svg id="curve" ') : html.index("</svg>")]
    lines = re.findall(r'<polyline class="series" points="([\d., ]+)"/>', curve)
    assert len(lines) == 2  # broken at the NaN
    assert curve.count('class="nonfinite"') == 1
    assert 'class="marker marker-checkpoint_saved"' in curve
    assert '<svg id="curve-phone" class="phone"' in html
    assert "console/review.css" in html and 'id="edit-review"' not in html  # viewer: no form


@pytest.mark.django_db
def test_an_oncall_engineer_writes_it_on_the_page(flow):
    oncall = flow.team.person("oncall")
    client = logged_in(oncall)
    html = page(client, flow.incident_id)
    assert 'id="edit-review"' in html and "automatic draft, not saved yet" in html
    form = {
        "revision": "0",
        "follow_up_count": "3",
        "summary": "NaN at step 60.\r\nBraked in 8 s.",
        "root_cause": "A corrupt shard.",
        "follow_up-0-text": "Validate shards",
        "follow_up-0-owner": oncall.username,
        "follow_up-0-due_date": "2026-04-01",
        "follow_up-1-text": "",  # the form's empty rows are skipped
        "status": "draft",
    }
    response = client.post(f"/incidents/{flow.incident_id}/review/", form)
    assert response.status_code == 302
    review = Review.objects.get(incident_id=flow.incident_id)
    assert (review.revision, review.summary) == (2, "NaN at step 60.\nBraked in 8 s.")
    assert review.follow_ups.get().owner == oncall
    html = page(client, flow.incident_id)
    assert "A corrupt shard." in html and "r2 · " in html and "automatic draft · draft</li>" in html
    stale = client.post(f"/incidents/{flow.incident_id}/review/", form)
    assert stale.status_code == 400 and "revision 2 after revision 0" in stale.content.decode()
    final = client.post(
        f"/incidents/{flow.incident_id}/review/", {**form, "revision": "2", "status": "final"}
    )
    assert final.status_code == 302
    assert Incident.objects.get(pk=flow.incident_id).status == "reviewed"
    html = page(client, flow.incident_id)
    assert "Mark follow-ups done" in html and "readonly" in html
    # The final page's form, sent back with a follow-up ticked: accepted, text unchanged.
    done = {**form, "revision": "3", "status": "final", "follow_up_count": "1"}
    done["follow_up-0-done"] = "on"
    assert client.post(f"/incidents/{flow.incident_id}/review/", done).status_code == 302
    assert Review.objects.get().follow_ups.get().done is True
    assert ReviewRevision.objects.count() == 4


@pytest.mark.django_db
def test_a_viewer_posting_the_form_gets_a_403_with_the_reason(flow):
    client = logged_in(flow.team.person("viewer"))
    response = client.post(f"/incidents/{flow.incident_id}/review/", {"revision": "0"})
    assert response.status_code == 403
    assert "Only an on-call engineer or above may write" in response.content.decode()
    stranger = logged_in(flow.team.person(None))
    assert stranger.get(f"/incidents/{flow.incident_id}/review/").status_code == 404
    assert stranger.post(f"/incidents/{flow.incident_id}/review/", {}).status_code == 404


@pytest.mark.django_db
def test_the_team_report_page(flow):
    client = logged_in(flow.team.person("viewer"))
    url = f"/teams/{flow.team.team.pk}/report/"
    html = client.get(url, {"since": "2026-03-01", "until": "2026-03-03"}).content.decode()
    assert re.search(r'<tr data-level="L3">', html) and 'data-level="all"' in html
    assert f'href="/incidents/{flow.incident_id}/review/"' in html
    assert "8 s · 8 s" in html  # brake: median · p90 of one incident
    assert '<td class="num slowest-cell">1 min 22 s</td>' in html
    assert (
        "No incidents in this period." in client.get(url, {"until": "2026-01-01"}).content.decode()
    )
    assert client.get(url, {"since": "bad"}).status_code == 400
    assert logged_in(flow.team.person(None)).get(url).status_code == 404


def test_the_review_stylesheet_prints_without_the_console_chrome():
    css = (ROOT / "console/static/console/review.css").read_text()
    print_rules = css[css.index("@media print") :]
    assert ".topbar" in print_rules and ".no-print" in print_rules and "#fff" in print_rules
