"""The review against the real loop: NaN → L3 → checkpoint-and-pause → ack → resume, through
the real services at fixed instants, on PostgreSQL. Then the write-up's lifecycle: automatic
draft, edits kept as revisions, conflicts, marking it final (the incident becomes reviewed).
"""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from core.append_only import AppendOnlyError
from core.errors import Conflict, Forbidden, InvalidInput, NotFound
from incidents.models import (
    AuditEntry,
    FollowUp,
    Incident,
    Review,
    ReviewRevision,
    TimelineEntry,
)
from incidents.reviews.writeup import load_review, save_review
from incidents.teams.audit import AuditContext
from tests.support.review import (
    AT_ACK_ALERT,
    AT_ALERT,
    AT_CHECKPOINT,
    AT_HEALTHY,
    AT_NAN,
    AT_RESUMED,
    CHECKPOINT_STEP,
    GPUS_PER_NODE,
    NAN_STEP,
    NODES,
    T0,
    raise_alert,
)

pytestmark = pytest.mark.django_db

EXPECTED_TIMELINE = [
    # kind, seconds after T0, step, actor kind
    ("first_anomalous_point", AT_NAN, NAN_STEP, "system"),
    ("alert_raised", AT_ALERT, NAN_STEP, "system"),
    ("command_issued", AT_ALERT, None, "system"),
    ("acknowledged", AT_ACK_ALERT, NAN_STEP, "person"),
    ("command_acknowledged", AT_CHECKPOINT, CHECKPOINT_STEP, "agent"),
    ("checkpoint_saved", AT_CHECKPOINT, CHECKPOINT_STEP, "agent"),
    ("resources_released", AT_CHECKPOINT, CHECKPOINT_STEP, "agent"),
    ("command_issued", 100, None, "person"),
    ("command_acknowledged", AT_RESUMED, CHECKPOINT_STEP, "agent"),
    ("resumed", AT_RESUMED, CHECKPOINT_STEP, "agent"),
    # Resumed after its brake: the alert is re-armed (a recurrence brakes again) ...
    ("alert_resolved", AT_RESUMED, CHECKPOINT_STEP, "system"),
    # ... and the episode ends on the healthy points after the resume (63..81, one chunk).
    ("incident_resolved", AT_HEALTHY, CHECKPOINT_STEP + 19, "system"),
]


def test_the_flow_writes_every_event_in_order(flow):
    rows = load_review(flow.team.person("viewer"), flow.incident_id).rows
    assert [
        (row.kind, (row.at - T0).total_seconds(), row.step, row.actor_kind) for row in rows
    ] == EXPECTED_TIMELINE
    assert rows[3].actor == flow.team.person("oncall").username
    assert rows[7].actor == flow.team.person("manager").username
    assert rows[5].data["path"] == "/ckpt/step-62.pt" and rows[5].data["bytes"] == 7_340_032


def test_the_durations_are_exact(flow):
    durations = load_review(flow.team.person("viewer"), flow.incident_id).durations
    measured = {link.key: (link.seconds, link.steps, link.end_kind) for link in durations.links}
    assert measured == {
        "detect": (AT_ALERT - AT_NAN, 0, "alert_raised"),  # 3 s
        "notify": (None, None, None),  # no notification rows yet
        "acknowledge": (AT_ACK_ALERT - AT_ALERT, 0, "acknowledged"),  # 2 s
        "escalate": (0.0, 0, "alert_raised"),  # the first alert is the one that braked
        "brake": (AT_CHECKPOINT - AT_ALERT, CHECKPOINT_STEP - NAN_STEP, "checkpoint_saved"),
        "recover": (AT_RESUMED - AT_CHECKPOINT, 0, "resumed"),  # 82 s
    }
    assert durations.slowest.key == "recover"
    # Accelerators burn from the first anomalous point to the confirmed checkpoint.
    hours = NODES * GPUS_PER_NODE * (AT_CHECKPOINT - AT_NAN) / 3600
    assert durations.accelerator_hours == pytest.approx(hours)


def test_until_the_first_edit_readers_see_the_automatic_draft(flow):
    data = load_review(flow.team.person("viewer"), flow.incident_id)
    assert data.review is None and not Review.objects.exists()
    assert data.content["status"] == "draft" and data.content["follow_ups"] == []
    assert "the alert was raised 3 s later" in data.content["summary"]
    assert f"acknowledged by {flow.team.person('oncall').username}" in data.content["summary"]


def test_only_the_team_reads_it(flow):
    with pytest.raises(NotFound):
        load_review(flow.team.person(None), flow.incident_id)
    with pytest.raises(NotFound):
        load_review(flow.team.person("viewer"), 999_999)


def content(**changes) -> dict:
    return {
        "summary": "A NaN at step 60, braked in 8 s.",
        "root_cause": "One corrupt shard.",
        "follow_ups": [{"text": "Validate shards", "owner": None, "due_date": "2026-04-01"}],
        **changes,
    }


def test_edits_are_kept_as_revisions_starting_from_the_draft(flow):
    oncall, manager = flow.team.person("oncall"), flow.team.person("manager")
    review = save_review(oncall, flow.incident_id, content(), base_revision=0)
    assert review.revision == 2 and review.root_cause == "One corrupt shard."
    review = save_review(
        manager,
        flow.incident_id,
        content(follow_ups=[{"text": "Validate shards", "owner": oncall.username}]),
        base_revision=2,
    )
    revisions = list(ReviewRevision.objects.filter(review=review))
    assert [(r.number, r.author) for r in revisions] == [(1, None), (2, oncall), (3, manager)]
    assert "the alert was raised 3 s later" in revisions[0].content["summary"]  # the draft
    assert revisions[1].content["follow_ups"][0]["due_date"] == "2026-04-01"
    assert revisions[2].content["follow_ups"][0] == {
        "text": "Validate shards",
        "owner": oncall.username,
        "due_date": None,
        "done": False,
    }
    assert [(f.text, f.owner) for f in FollowUp.objects.filter(review=review)] == [
        ("Validate shards", oncall)
    ]


def test_a_revision_cannot_be_changed_even_by_sql(flow):
    save_review(flow.team.person("oncall"), flow.incident_id, content(), base_revision=0)
    revision = ReviewRevision.objects.first()
    with pytest.raises(AppendOnlyError):
        revision.save()
    with (
        pytest.raises(IntegrityError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("UPDATE incidents_reviewrevision SET content = '{}'")


def test_a_stale_edit_is_refused_and_writes_nothing(flow):
    oncall = flow.team.person("oncall")
    save_review(oncall, flow.incident_id, content(), base_revision=0)
    save_review(oncall, flow.incident_id, content(impact="none"), base_revision=2)
    with pytest.raises(Conflict, match="revision 3 after revision 2"):
        save_review(flow.team.person("admin"), flow.incident_id, content(), base_revision=2)
    with pytest.raises(Conflict, match="revision 3 after revision 0"):
        save_review(flow.team.person("admin"), flow.incident_id, content(), base_revision=0)
    assert ReviewRevision.objects.count() == 3


@pytest.mark.parametrize("role", ["viewer", None])
def test_below_oncall_nobody_edits_and_the_refusal_is_audited(flow, role):
    person = flow.team.person(role)
    expected = Forbidden if role else NotFound
    with pytest.raises(expected) as refusal:
        save_review(person, flow.incident_id, content(), base_revision=0, context=AuditContext())
    if role == "viewer":
        assert refusal.value.detail == (
            "Only an on-call engineer or above may write an incident's post-mortem review; "
            "your role in this team is viewer."
        )
    entry = AuditEntry.objects.get(user=person)
    assert (entry.action, entry.allowed, entry.target_id) == (
        "edit_review",
        False,
        flow.incident_id,
    )
    assert not Review.objects.exists()


def test_an_owner_must_belong_to_the_team(flow):
    stranger = flow.team.person(None)
    bad = content(follow_ups=[{"text": "x", "owner": stranger.username}])
    with pytest.raises(InvalidInput) as refused:
        save_review(flow.team.person("oncall"), flow.incident_id, bad, base_revision=0)
    assert refused.value.fields == {"follow_ups[0].owner": "not a member of the incident's team"}


def test_marking_it_final_makes_the_incident_reviewed_with_a_timeline_row(flow):
    oncall = flow.team.person("oncall")
    save_review(oncall, flow.incident_id, content(), base_revision=0)
    review = save_review(oncall, flow.incident_id, content(status="final"), base_revision=2)
    assert review.status == "final" and review.finalized_at is not None
    assert Incident.objects.get(pk=flow.incident_id).status == "reviewed"
    last = TimelineEntry.objects.filter(incident_id=flow.incident_id).last()
    assert (last.kind, last.actor, last.data["event"]) == ("note", oncall, "review_final")
    # Final: the text stays as signed off; follow-ups can still be marked done.
    with pytest.raises(Conflict, match="final"):
        save_review(oncall, flow.incident_id, content(summary="rewritten"), base_revision=3)
    done = content(follow_ups=[{"text": "Validate shards", "due_date": "2026-04-01", "done": True}])
    review = save_review(flow.team.person("manager"), flow.incident_id, done, base_revision=3)
    assert review.status == "final" and review.revision == 4
    assert FollowUp.objects.get(review=review).done is True


def test_an_unresolved_incident_cannot_be_signed_off(team):
    alert = raise_alert(team.job_id, "L3")
    oncall = team.person("oncall")
    with pytest.raises(Conflict, match="is open: its review can be marked final once"):
        save_review(oncall, alert.incident_id, content(status="final"), base_revision=0)
    assert not Review.objects.exists()  # the whole save rolled back
    save_review(oncall, alert.incident_id, content(), base_revision=0)  # a draft is fine
    assert Incident.objects.get(pk=alert.incident_id).status == "open"


@pytest.mark.parametrize(
    ("kind", "status", "expected"),
    [
        ("lower_lr", "succeeded", "mitigated"),
        ("pause_data", "succeeded", "mitigated"),
        ("lower_lr", "failed", "open"),
    ],
)
def test_an_acknowledged_soft_mitigation_mitigates_the_incident(team, kind, status, expected):
    from breakers.control.acknowledge import acknowledge_command
    from breakers.control.commands import issue_command

    alert = raise_alert(team.job_id, "L2")
    command = issue_command(
        team.job_id, kind, reason="L2 loss deviation", severity="L2", alert_id=alert.pk
    ).command
    acknowledge_command(team.job_id, command.pk, status=status, result={})
    assert Incident.objects.get(pk=alert.incident_id).status == expected
