"""The console pages: login, team scoping (404), what needs me on top, buttons by role."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from breakers.agent.protocol import PointIn
from breakers.agent.store import store_points
from breakers.control.acknowledge import acknowledge_command
from breakers.control.commands import issue_command
from incidents.alerts.lifecycle import AlertSignal, raise_or_update_alert
from incidents.models import Job, JobStatus, Membership, Role, Team

pytestmark = pytest.mark.django_db

PAGES = ["/", "/alerts/", "/approvals/"]


@pytest.fixture
def member(db):
    def make(username: str, team: str, role: str = Role.VIEWER):
        user = get_user_model().objects.create_user(username, password="pw-for-tests")
        Membership.objects.create(
            user=user, team=Team.objects.get_or_create(name=team)[0], role=role
        )
        return user

    return make


def signal(severity: str = "L3", step: int = 10, rule: str = "non-finite") -> AlertSignal:
    now = timezone.now()
    return AlertSignal(
        rule_key=rule,
        rule_name=f"rule {rule}",
        layer="stability",
        severity=severity,
        metric="loss",
        node="",
        value=float("nan"),
        threshold=None,
        description="loss is NaN",
        step=step,
        time=now,
        first_step=step,
        first_time=now,
        action="checkpoint_and_pause",
    )


def buttons(html: bytes) -> list[str]:
    return re.findall(
        r'<button type="button" class="act [^"]*"[^>]*>([^<]+)</button>', html.decode()
    )


@pytest.mark.parametrize("path", [*PAGES, "/jobs/1/", "/incidents/1/"])
def test_every_page_needs_a_login(client, path):
    response = client.get(path)
    assert response.status_code == 302 and response.url.startswith("/login/")


def test_pages_of_another_teams_job_and_incident_are_404(client, member, make_agent):
    other = make_agent(team="secret", name="hidden-run")
    incident_id = raise_or_update_alert(other.job_id, signal()).alert.incident_id
    client.force_login(member("ana", "vision"))
    assert client.get(f"/jobs/{other.job_id}/").status_code == 404
    assert client.get(f"/jobs/{other.job_id}/?partial=state").status_code == 404
    assert client.get(f"/incidents/{incident_id}/").status_code == 404
    for path in PAGES:
        page = client.get(path)
        assert page.status_code == 200 and b"hidden-run" not in page.content


def test_what_needs_me_is_on_top(client, member, make_agent):
    quiet = make_agent(team="vision", name="a-quiet")
    burning = make_agent(team="vision", name="z-burning")
    silent = make_agent(team="vision", name="m-silent")
    Job.objects.filter(pk__in=[quiet.job_id, silent.job_id]).update(status=JobStatus.RUNNING)
    Job.objects.filter(pk=silent.job_id).update(
        heartbeat_deadline=timezone.now() - timedelta(seconds=30)
    )
    raise_or_update_alert(burning.job_id, signal("L3"))
    client.force_login(member("ana", "vision"))
    html = client.get("/").content.decode()
    order = re.findall(r'class="jobname" href="/jobs/\d+/">([^<]+)<', html)
    assert order == ["z-burning", "m-silent", "a-quiet"]
    assert "L3 alert firing" in html and "status-silent" in html
    assert '<span class="chip level-L3">1 L3</span>' in html


def test_a_paused_job_whose_ranks_fell_silent_shows_as_silent(client, member, make_agent):
    """A held rank heartbeats "paused": the watchdog alerts when every rank of a paused job
    falls silent (gone or hung), and the dashboard says the same, not "paused"."""
    held = make_agent(team="vision", name="held")
    gone = make_agent(team="vision", name="gone")
    Job.objects.filter(pk__in=[held.job_id, gone.job_id]).update(
        status=JobStatus.PAUSED, heartbeat_deadline=timezone.now() + timedelta(seconds=30)
    )
    Job.objects.filter(pk=gone.job_id).update(
        heartbeat_deadline=timezone.now() - timedelta(seconds=30)
    )
    client.force_login(member("ana", "vision"))
    html = client.get("/").content.decode()
    order = re.findall(r'class="jobname" href="/jobs/\d+/">([^<]+)<', html)
    assert order == ["gone", "held"]
    assert html.count("status-silent") == 1 and "silent: no heartbeat" in html
    page = client.get(f"/jobs/{gone.job_id}/").content.decode()
    assert "status-silent" in page


def test_the_job_page_shows_buttons_by_role(client, member, make_agent):
    job = make_agent(team="vision", name="vit")
    store_points(job.job_id, [PointIn("loss", 1, 2.0, None, None)])  # now running
    expected = {
        Role.VIEWER: [],
        Role.ONCALL: ["Pause"],
        Role.MANAGER: ["Pause", "Terminate"],
    }
    for role, labels in expected.items():
        client.force_login(member(f"user-{role}", "vision", role))
        page = client.get(f"/jobs/{job.job_id}/")
        assert page.status_code == 200
        assert buttons(page.content) == labels, role


def test_pausing_then_paused_with_the_checkpoint_and_confirm_buttons(client, member, make_agent):
    job = make_agent(team="vision", name="vit")
    store_points(job.job_id, [PointIn("loss", 1, 2.0, None, None)])
    alert = raise_or_update_alert(job.job_id, signal("L3")).alert
    command = issue_command(
        job.job_id, "checkpoint_and_pause", reason="loss is NaN", severity="L3", alert_id=alert.pk
    ).command
    client.force_login(member("olga", "vision", Role.ONCALL))
    state = client.get(f"/jobs/{job.job_id}/?partial=state").content.decode()
    assert 'data-status="pausing"' in state and "Pausing…" in state
    # Nothing to pause; the alert fires. The pause may be confirmed already: confirm_pause
    # takes a pausing job (its decision is carried out after the checkpoint). No checkpoint
    # in the catalogue yet: nothing to roll back to.
    expected = ["Take it", "Keep paused", "Confirm &amp; resume", "Acknowledge", "Snooze pages"]
    assert buttons(state.encode()) == expected
    acknowledge_command(
        job.job_id,
        command.pk,
        status="succeeded",
        result={
            "path": "/ckpt/step-10.pt",
            "bytes": 2_500_000,
            "seconds": 1.5,
            "step": 10,
            "sha256": "ab" * 32,
        },  # with its hash it is in the catalogue: Roll back… offers it
    )
    state = client.get(f"/jobs/{job.job_id}/?partial=state").content.decode()
    assert 'data-status="paused"' in state and "/ckpt/step-10.pt" in state
    assert "2.4\xa0MB" in state and "1.5 s" in state and "awaiting confirmation" in state
    # On-call confirms the automatic L3 pause (resume is a manager's, terminate too).
    assert buttons(state.encode()) == [
        "Take it",
        "Keep paused",
        "Confirm &amp; resume",
        "Roll back…",
        "Acknowledge",
        "Snooze pages",
    ]


def test_alerts_feed_lists_open_alerts_with_acknowledge_for_oncall(client, member, make_agent):
    job = make_agent(team="vision", name="vit")
    raise_or_update_alert(job.job_id, signal("L2", rule="loss-sustained"))
    client.force_login(member("olga", "vision", Role.ONCALL))
    page = client.get("/alerts/")
    assert b"rule loss-sustained" in page.content
    assert buttons(page.content) == ["Acknowledge", "Snooze pages", "Request escalation"]
    client.force_login(member("vera", "vision", Role.VIEWER))
    assert buttons(client.get("/alerts/?partial=list").content) == []


def test_incident_page_shows_the_timeline(client, member, make_agent):
    job = make_agent(team="vision", name="vit")
    incident_id = raise_or_update_alert(job.job_id, signal("L3")).alert.incident_id
    client.force_login(member("ana", "vision"))
    page = client.get(f"/incidents/{incident_id}/").content.decode()
    assert "First anomalous point" in page and "Alert raised" in page
    assert 'data-live-topics="[[&quot;job&quot;,' in page


def test_every_page_has_the_live_indicator_and_the_health_banner(client, member, make_agent):
    job = make_agent(team="vision", name="vit")
    client.force_login(member("ana", "vision"))
    for path in [*PAGES, f"/jobs/{job.job_id}/"]:
        html = client.get(path).content.decode()
        assert 'id="live-indicator"' in html and 'id="health-banner"' in html, path
        assert "/static/console/live.js" in html


def test_static_files_are_served_with_uplot(client):
    for path in ["/static/vendor/uplot/uPlot.iife.min.js", "/static/console/job.js"]:
        response = client.get(path)
        assert response.status_code == 200, path


def test_the_dashboard_asks_as_many_queries_for_six_paused_jobs_as_for_two(
    client, member, make_agent
):
    """Whether a pause awaits confirmation is decided for every row at once, not per row."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def paused_jobs(names: list[str]) -> None:
        for name in names:
            job = make_agent(team="vision", name=name)
            issue_command(job.job_id, "checkpoint_and_pause", reason="held")
            Job.objects.filter(pk=job.job_id).update(status=JobStatus.PAUSED)

    client.force_login(member("ana", "vision"))
    counts = []
    for names in (["a", "b"], ["c", "d", "e", "f"]):
        paused_jobs(names)
        client.get("/")  # what a first visit caches (the session, the user's teams) is not counted
        with CaptureQueriesContext(connection) as queries:
            html = client.get("/").content.decode()
        counts.append(len(queries))
    assert html.count("confirms keep / resume / roll back") == 6
    assert counts[0] == counts[1], counts


def test_drill_sandboxes_stay_off_the_dashboard_and_are_marked_where_they_show(
    client, member, make_agent
):
    real = make_agent(team="vision", name="vit")
    drill = make_agent(team="vision", name="drill-nan_loss-1")
    Job.objects.filter(pk=drill.job_id).update(drill_sandbox=True)
    raise_or_update_alert(drill.job_id, signal("L3"))
    client.force_login(member("ana", "vision", Role.MANAGER))
    html = client.get("/").content.decode()
    names = re.findall(r'class="jobname" href="/jobs/\d+/">([^<]+)<', html)
    assert names == ["vit"] and "1 drill sandbox job not listed" in html
    rows = client.get("/?partial=rows").content.decode()
    assert "drill-nan_loss-1" not in rows and f"&quot;job&quot;,{real.job_id}" in rows
    assert "drill-nan_loss-1" not in client.get("/silences/").content.decode()
    for page in [f"/jobs/{drill.job_id}/", "/alerts/", "/incidents/"]:
        assert 'class="chip drill"' in client.get(page).content.decode(), page
    assert 'class="chip drill"' not in client.get(f"/jobs/{real.job_id}/").content.decode()


def test_roll_back_choices_list_clean_checkpoints_newest_first_then_the_others(make_agent):
    from breakers.checkpoints import CheckpointReport, record_checkpoint
    from console.board import _roll_back_choices
    from incidents.models import Incident

    job = make_agent(team="vision", name="vit")
    raise_or_update_alert(job.job_id, signal("L3"))
    Incident.objects.filter(job_id=job.job_id).update(first_step=500)
    for step, weights in [(600, 600), (400, 400), (555, 499), (200, 200), (520, 520)]:
        digest = f"{step:064d}"
        report = CheckpointReport(f"/ck/{step}", digest, step, weights_step=weights)
        record_checkpoint(job.job_id, report)
    choices = _roll_back_choices(Job.objects.get(pk=job.job_id))
    labels = [label.split(" · ")[:2] for _, label in choices]
    assert labels == [
        ["step 555", "clean"],
        ["step 400", "clean"],
        ["step 200", "clean"],
        ["step 600", "after the anomaly"],
        ["step 520", "after the anomaly"],
    ]


def test_the_silences_form_offers_the_rule_keys_and_a_fresh_alert_has_no_zero_duration(
    client, member, make_agent
):
    job = make_agent(team="vision", name="vit")
    raise_or_update_alert(job.job_id, signal("L3", rule="loss-nan"))
    client.force_login(member("mia", "vision", Role.MANAGER))
    page = client.get("/silences/").content.decode()
    datalist = page.split('id="rule-keys"')[1].split("</datalist>")[0]
    options = re.findall(r'<option value="([^"]+)">', datalist)
    assert "loss-nan" in options and options == sorted(options)
    for path in [f"/jobs/{job.job_id}/", "/alerts/"]:
        assert "for 0 s" not in client.get(path).content.decode(), path
