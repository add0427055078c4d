"""The review over REST: who reads and who edits, CSRF on the session, the exports (the JSON
round-trips: the timeline and its durations rebuild from it alone), the team report."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client

from incidents.alerts.lifecycle import append_timeline
from incidents.job_size import declare_job_size
from incidents.jobs import create_job
from incidents.models import AuditEntry, Incident, Job, TimelineEntry
from incidents.reviews.export import durations_from_document, rows_from_document
from tests.support.review import T0, Team

pytestmark = pytest.mark.django_db


def client_for(user, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def put(client: Client, incident_id: int, body: dict, **headers):
    return client.put(
        f"/api/v1/incidents/{incident_id}/review",
        json.dumps(body),
        content_type="application/json",
        headers=headers,
    )


EDIT = {
    "revision": 0,
    "summary": "Braked in 8 s.",
    "root_cause": "A corrupt shard.",
    "follow_ups": [{"text": "Validate shards", "due_date": "2026-04-01"}],
}


def urls(incident_id: int) -> list[str]:
    base = f"/api/v1/incidents/{incident_id}/review"
    return [base, base + ".md", base + ".json", f"/incidents/{incident_id}/review/"]


@pytest.mark.parametrize("role", ["viewer", "oncall", "manager", "admin"])
def test_every_member_of_the_team_reads_the_review(flow, role):
    client = client_for(flow.team.person(role))
    for url in urls(flow.incident_id):
        assert client.get(url).status_code == 200, url
    document = client.get(urls(flow.incident_id)[0]).json()
    assert document["can_edit"] is (role != "viewer")
    assert document["review"]["generated"] is True and document["review"]["revision"] == 0


def test_people_of_other_teams_get_the_404_of_a_missing_incident(flow):
    client = client_for(flow.team.person(None))
    for url in urls(flow.incident_id) + urls(999_999):
        assert client.get(url).status_code == 404, url
    answer = client.get(urls(flow.incident_id)[0]).json()
    assert answer == {
        "error": "not_found",
        "detail": f"There is no incident {flow.incident_id}.",
        "fields": {},
    }
    assert put(client, flow.incident_id, EDIT).status_code == 404


def test_nobody_reads_it_without_logging_in(flow):
    anonymous = Client()
    for url in urls(flow.incident_id)[:3]:
        assert anonymous.get(url).status_code == 401, url  # as the API documents
    assert anonymous.get(urls(flow.incident_id)[3]).status_code == 302  # to the login page


def test_a_viewer_may_not_edit_and_is_told_why(flow):
    viewer = flow.team.person("viewer")
    response = put(client_for(viewer), flow.incident_id, EDIT)
    assert response.status_code == 403
    assert response.json() == {
        "error": "forbidden",
        "detail": "Only an on-call engineer or above may write an incident's post-mortem "
        "review; your role in this team is viewer.",
        "fields": {},
    }
    assert AuditEntry.objects.get(user=viewer).allowed is False


@pytest.mark.parametrize("role", ["oncall", "manager", "admin"])
def test_oncall_and_above_edit_with_a_csrf_token(flow, role):
    client = client_for(flow.team.person(role), csrf=True)
    assert put(client, flow.incident_id, EDIT).status_code == 403  # no CSRF token
    client.get(f"/incidents/{flow.incident_id}/review/")  # the page sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    response = put(client, flow.incident_id, EDIT, **{"X-CSRFToken": token})
    assert response.status_code == 200, response.content
    review = response.json()["review"]
    assert (review["revision"], review["root_cause"], review["generated"]) == (
        2,
        "A corrupt shard.",
        False,
    )
    assert review["follow_ups"] == [
        {"text": "Validate shards", "owner": None, "due_date": "2026-04-01", "done": False}
    ]
    revisions = response.json()["revisions"]
    assert [(r["number"], r["author"]) for r in revisions] == [
        (1, None),
        (2, flow.team.person(role).username),
    ]


def test_bad_bodies_and_stale_edits_are_refused(flow):
    client = client_for(flow.team.person("oncall"))
    bad = put(client, flow.incident_id, {**EDIT, "follow_ups": [{"text": "", "due_date": "x"}]})
    assert bad.status_code == 400
    assert set(bad.json()["fields"]) == {"follow_ups[0].text", "follow_ups[0].due_date"}
    assert put(client, flow.incident_id, {"summary": "no revision"}).status_code == 400
    assert put(client, flow.incident_id, EDIT).status_code == 200
    stale = put(client, flow.incident_id, EDIT)  # still based on revision 0
    assert stale.status_code == 409 and stale.json()["error"] == "conflict"
    early = put(client, flow.incident_id, {**EDIT, "revision": 2, "status": "final"})
    assert early.status_code == 200  # the flow's incident is resolved: it can be signed off
    assert early.json()["incident"]["status"] == "reviewed"


def test_the_json_export_rebuilds_the_timeline_and_its_durations(flow):
    client = client_for(flow.team.person("oncall"))
    put(client, flow.incident_id, EDIT)
    response = client.get(f"/api/v1/incidents/{flow.incident_id}/review.json")
    assert response.status_code == 200
    assert "attachment" in response["Content-Disposition"]
    document = json.loads(response.content)
    rebuilt = [
        (r.kind, r.at, r.step, r.actor_kind, r.actor, r.message, dict(r.data), r.alert_id)
        for r in rows_from_document(document)
    ]
    stored = [
        (
            e.kind,
            e.at,
            e.step,
            e.actor_kind,
            e.actor.username if e.actor else None,
            e.message,
            e.data,
            e.alert_id,
        )
        for e in TimelineEntry.objects.filter(incident_id=flow.incident_id).select_related("actor")
    ]
    assert rebuilt == stored and len(stored) == 12
    assert durations_from_document(document).as_dict() == document["durations"]
    links = {link["key"]: link for link in document["durations"]["links"]}
    assert links["brake"]["seconds"] == 8.0
    assert (links["brake"]["start_kind"], links["brake"]["end_kind"]) == (
        "alert_raised",
        "checkpoint_saved",
    )
    assert document["job_size"] == {
        "nodes": 4,
        "gpus_per_node": 8,
        "accelerator": "H100",
        "source": "declared",
    }
    assert document["review"]["root_cause"] == "A corrupt shard."
    assert document["review"]["follow_ups"][0]["text"] == "Validate shards"
    assert [r["number"] for r in document["revisions"]] == [1, 2]


def test_the_markdown_export(flow):
    client = client_for(flow.team.person("viewer"))
    response = client.get(f"/api/v1/incidents/{flow.incident_id}/review.md")
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    text = response.content.decode()
    assert text.startswith(f"# Incident #{flow.incident_id} review: NaN/Inf in loss or gradients")
    assert "| Time to brake | 8 s | 2 |" in text
    assert "| Time to recover (slowest) | 1 min 22 s | 0 |" in text
    assert "## Root cause\n\n_Not written yet._" in text  # the draft leaves it to the writer
    assert "| 2026-03-02 09:00:21 UTC | 62 | the training process | Checkpoint saved at" in text


def test_the_schema_documents_the_review_endpoints(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    review = schema["paths"]["/api/v1/incidents/{id}/review"]
    assert set(review) >= {"get", "put"}
    assert set(review["put"]["responses"]) >= {"200", "400", "403", "404", "409"}
    assert "/api/v1/incidents/{id}/review.md" in schema["paths"]
    assert "/api/v1/teams/{id}/incident-report" in schema["paths"]


# --- The team report ----------------------------------------------------------------------


def episode(job_id: int, level: str, opened_after: float, brake: float | None) -> Incident:
    """An incident whose timeline says: alert 2 s after the first point, braked ``brake`` s
    after the alert (None: never)."""
    opened = T0 + timedelta(seconds=opened_after)
    incident = Incident.objects.create(
        job_id=job_id,
        title=f"{level} episode",
        level=level,
        status="resolved",
        opened_at=opened,
        first_step=10,
        first_time=opened,
    )
    append_timeline(incident.pk, "first_anomalous_point", "first", at=opened, step=10)
    append_timeline(incident.pk, "alert_raised", "alert", at=opened + timedelta(seconds=2))
    if brake is not None:
        at = opened + timedelta(seconds=2 + brake)
        append_timeline(incident.pk, "checkpoint_saved", "saved", at=at)
    return incident


def test_the_team_report_gives_median_and_p90_by_level(team: Team):
    declare_job_size(team.job_id, nodes=2, gpus_per_node=8)
    for index, brake in enumerate([10, 20, 60]):
        episode(team.job_id, "L3", 3600 * index, brake)
    episode(team.job_id, "L2", 100, None)
    episode(team.job_id, "L3", -86_400 * 40, 1)  # before the period
    other = create_job("elsewhere", "theirs").job
    episode(other.pk, "L3", 50, 5)  # another team's
    client = client_for(team.person("viewer"))
    url = f"/api/v1/teams/{team.team.pk}/incident-report"
    report = client.get(url, {"since": "2026-03-01", "until": "2026-03-03"}).json()
    assert [i["level"] for i in report["incidents"]] == ["L3", "L2", "L3", "L3"]
    levels = {line["level"]: line for line in report["levels"]}
    assert list(levels) == ["L2", "L3", "all"]
    assert levels["L3"]["incidents"] == 3
    assert levels["L3"]["links"]["brake"] == {"measured": 3, "median": 20.0, "p90": 52.0}
    assert levels["L3"]["links"]["detect"] == {"measured": 3, "median": 2.0, "p90": 2.0}
    assert levels["L2"]["links"]["brake"] == {"measured": 0, "median": None, "p90": None}
    assert levels["all"]["incidents"] == 4
    # 16 accelerators × (2 + brake) s each, summed over the braked L3 incidents.
    assert levels["L3"]["accelerator_hours"] == pytest.approx(16 * (12 + 22 + 62) / 3600)
    assert client.get(url, {"since": "2026-03-03", "until": "2026-03-01"}).status_code == 400
    assert client.get(url, {"since": "yesterday"}).status_code == 400
    stranger = client_for(team.person(None))
    assert stranger.get(url).status_code == 404


def test_a_fire_drills_incidents_are_left_out_of_the_teams_report(team: Team):
    """A drill's fault is injected on purpose: its incident is scored on the drill's page, and
    would only blur the medians of the team's real chain."""
    episode(team.job_id, "L3", 10, 5)
    drill = create_job(team.team.name, "drill-nan_loss-1").job
    Job.objects.filter(pk=drill.pk).update(drill_sandbox=True)
    episode(drill.pk, "L3", 20, 90)
    client = client_for(team.person("viewer"))
    url = f"/api/v1/teams/{team.team.pk}/incident-report"
    report = client.get(url, {"since": "2026-03-01", "until": "2026-03-03"}).json()
    assert [i["job"] for i in report["incidents"]] == [Job.objects.get(pk=team.job_id).name]
    assert report["drill_incidents"] == 1
    page = client.get(
        f"/teams/{team.team.pk}/report/", {"since": "2026-03-01", "until": "2026-03-03"}
    )
    assert "1 fire drill incident in this period is not counted here" in page.content.decode()
