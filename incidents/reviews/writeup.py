"""Post-incident reviews: reading one (timeline, durations, write-up), editing the write-up,
marking it final (the incident becomes reviewed).

Who may do what: every member of the incident's team reads (anyone else gets the 404 of an
incident that does not exist); on-call and above edit (``incidents.teams.authority``, action
``edit_review``; refused with 403 and its reason, and audited like every person's action).

Until its first edit a review is not stored: readers see the automatic draft computed afresh
from the timeline. The first save stores that draft as revision 1 (no author), then the
writer's text as revision 2, so the history shows what the writer changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from core.errors import Conflict, InvalidInput
from core.transitions import compare_and_swap
from incidents.alerts.lifecycle import append_timeline
from incidents.models import (
    INCIDENT_TRANSITIONS,
    REVIEW_TRANSITIONS,
    ActorKind,
    FollowUp,
    Incident,
    IncidentStatus,
    JobSize,
    Membership,
    Recovery,
    Review,
    ReviewRevision,
    ReviewStatus,
    TimelineEntry,
    TimelineKind,
)
from incidents.recoveries import recoveries
from incidents.reviews.content import TEXT_FIELDS, frozen_part, validate_content
from incidents.reviews.draft import IncidentFacts, draft
from incidents.reviews.durations import DeclaredSize, Durations, Row, measure
from incidents.reviews.export import FORMAT, iso, row_as_dict
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import AuditContext, audited
from incidents.teams.authority import Action, decide
from incidents.teams.users import User, Visitor


@dataclass(frozen=True)
class ReviewData:
    """Everything a review page or export shows, read once."""

    incident: Incident
    rows: list[Row]
    row_ids: list[int]
    size: JobSize | None
    durations: Durations
    review: Review | None  # None: not edited yet, ``content`` is the automatic draft
    content: dict[str, Any]
    recoveries: list[Recovery]  # the automatic recovery verdicts, oldest first


def readable_incident(user: Visitor, incident_id: int) -> Incident:
    """The incident if the user's teams may see it, else NotFound (the same 404 as a missing
    one, so other teams' ids never leak)."""
    return scoped_get(
        Incident.objects.select_related("job__team"),
        user,
        incident_id,
        team_path="job__team_id",
        noun="incident",
    )


def may_edit(user: Visitor, incident: Incident) -> bool:
    return decide(role_in_team(user, incident.job.team_id), Action.EDIT_REVIEW).allowed


def timeline_rows(incident_ids: list[int]) -> dict[int, list[tuple[int, Row]]]:
    """The timeline of each incident, in order, as plain rows (with their ids)."""
    rows: dict[int, list[tuple[int, Row]]] = {pk: [] for pk in incident_ids}
    entries = (
        TimelineEntry.objects.filter(incident_id__in=incident_ids)
        .select_related("actor")
        .order_by("incident_id", "at", "id")
    )
    for entry in entries:
        row = Row(
            kind=entry.kind,
            at=entry.at,
            step=entry.step,
            actor_kind=entry.actor_kind,
            actor=entry.actor.get_username() if entry.actor else None,
            message=entry.message,
            data=entry.data,
            alert_id=entry.alert_id,
        )
        rows[entry.incident_id].append((entry.pk, row))
    return rows


def declared(size: JobSize | None) -> DeclaredSize | None:
    if size is None:
        return None
    return DeclaredSize(size.nodes, size.gpus_per_node, size.source)


def facts_of(incident: Incident) -> IncidentFacts:
    job = incident.job
    return IncidentFacts(
        id=incident.pk,
        title=incident.title,
        level=incident.level,
        job=f"{job.team.name}/{job.name}",
        first_at=incident.first_time,
        first_step=incident.first_step,
    )


def load_review(user: Visitor, incident_id: int) -> ReviewData:
    """The incident's review as its team sees it (404 for anyone else)."""
    incident = readable_incident(user, incident_id)
    pairs = timeline_rows([incident.pk])[incident.pk]
    rows = [row for _, row in pairs]
    size = JobSize.objects.filter(job_id=incident.job_id).first()
    durations = measure(rows, incident.first_time, incident.first_step, declared(size))
    review = Review.objects.filter(incident=incident).select_related("updated_by").first()
    content: dict[str, Any]
    if review is None:
        content = {"status": ReviewStatus.DRAFT, **draft(facts_of(incident), rows, durations)}
        content["follow_ups"] = []
    else:
        content = stored_content(review)
    verdicts = recoveries(incident.pk)
    ids = [pk for pk, _ in pairs]
    return ReviewData(incident, rows, ids, size, durations, review, content, verdicts)


def stored_content(review: Review) -> dict[str, Any]:
    """The write-up as stored, in the shape of ``incidents.reviews.content``."""
    follow_ups = review.follow_ups.select_related("owner")
    return {
        "status": review.status,
        **{name: getattr(review, name) for name in TEXT_FIELDS},
        "follow_ups": [
            {
                "text": f.text,
                "owner": f.owner.get_username() if f.owner else None,
                "due_date": f.due_date.isoformat() if f.due_date else None,
                "done": f.done,
            }
            for f in follow_ups
        ],
    }


def review_document(data: ReviewData) -> dict[str, Any]:
    """The complete export (JSON): enough to rebuild the timeline and its durations elsewhere
    (``incidents.reviews.export.rows_from_document``)."""
    incident, review = data.incident, data.review
    revisions = review.revisions.select_related("author") if review else []
    return {
        "format": FORMAT,
        "incident": _incident_dict(incident),
        "job_size": (
            {
                "nodes": data.size.nodes,
                "gpus_per_node": data.size.gpus_per_node,
                "accelerator": data.size.accelerator,
                "source": data.size.source,
            }
            if data.size
            else None
        ),
        "timeline": [row_as_dict(row, pk) for pk, row in zip(data.row_ids, data.rows, strict=True)],
        "durations": data.durations.as_dict(),
        "recoveries": [recovery_dict(r) for r in data.recoveries],
        "review": {
            **data.content,
            "generated": review is None,
            "revision": review.revision if review else 0,
            "updated_at": iso(review.updated_at) if review else None,
            "updated_by": _username(review.updated_by) if review else None,
            "finalized_at": iso(review.finalized_at) if review else None,
        },
        "revisions": [
            {
                "number": r.number,
                "author": _username(r.author),
                "at": iso(r.at),
                "content": r.content,
            }
            for r in revisions
        ],
    }


def recovery_dict(row: Recovery) -> dict[str, Any]:
    """An automatic recovery's verdict as the export shows it."""
    return {
        "pause_command_id": row.pause_command_id,
        "rule_key": row.rule_key,
        "cause": row.cause,
        "window": [row.first_step, row.last_step],
        "rank": row.rank,
        "node": row.node,
        "verdict": row.verdict,
        "reasons": list(row.reasons),
        "status": row.status,
        "decided_at": iso(row.decided_at),
        "checkpoint_step": row.checkpoint_step,
        "skip_steps": list(row.skip_steps),
        "taken_over_by": _username(row.taken_over_by),
    }


def _incident_dict(incident: Incident) -> dict[str, Any]:
    job = incident.job
    return {
        "id": incident.pk,
        "title": incident.title,
        "level": incident.level,
        "status": incident.status,
        "job": {"id": job.pk, "name": job.name, "team": job.team.name},
        "opened_at": iso(incident.opened_at),
        "first_anomalous_point": {"at": iso(incident.first_time), "step": incident.first_step},
        "resolved_at": iso(incident.resolved_at),
        "resolved_step": incident.resolved_step,
    }


def save_review(
    user: User,
    incident_id: int,
    content: dict[str, Any],
    *,
    base_revision: int,
    context: AuditContext | None = None,
) -> Review:
    """Store the writer's edit of the write-up as a new revision; with ``status: final`` also
    mark it final, which makes the incident reviewed.

    ``base_revision`` is the revision the writer started from (0: the automatic draft): when
    somebody saved in between, 409 and nothing is written. A final review keeps its text;
    only its follow-ups can still be marked done.
    """
    with audited(user, Action.EDIT_REVIEW, "incident", incident_id, context) as attempt:
        incident = scoped_get(
            Incident.objects.select_related("job__team"),
            user,
            incident_id,
            team_path="job__team_id",
            noun="incident",
            attempt=attempt,
        )
        role = role_in_team(user, incident.job.team_id)
        attempt.check(decide(role, Action.EDIT_REVIEW, incident.level))
        clean = _validated(content, incident.job.team_id)
        now = timezone.now()
        with transaction.atomic():
            # The incident's row lock serialises the writers of its review (and its creation).
            incident = Incident.objects.select_for_update(no_key=True).get(pk=incident.pk)
            review, started = _lock_or_start(incident, base_revision, now)
            # A new review's base is the unsaved draft (0), stored as revision 1 just now.
            _check_editable(review, clean, 1 if started else base_revision)
            _write(review, clean, user, now)
            if clean["status"] == ReviewStatus.FINAL and review.status == ReviewStatus.DRAFT:
                _finalize(review, incident, user, now)
            attempt.succeeded(f"review of incident #{incident.pk} saved as r{review.revision}")
    return review


def _validated(content: dict[str, Any], team_id: int) -> dict[str, Any]:
    clean, errors = validate_content(content)
    owners = {f["owner"] for f in clean["follow_ups"] if f["owner"]}
    members = set(
        Membership.objects.filter(team_id=team_id, user__username__in=owners).values_list(
            "user__username", flat=True
        )
    )
    for index, item in enumerate(clean["follow_ups"]):
        if item["owner"] and item["owner"] not in members:
            errors[f"follow_ups[{index}].owner"] = "not a member of the incident's team"
    if errors:
        raise InvalidInput("The review was refused.", fields=errors)
    return clean


def _lock_or_start(incident: Incident, base_revision: int, now) -> tuple[Review, bool]:
    """The stored review, or a new one holding the automatic draft as revision 1 (True)."""
    review = Review.objects.filter(incident=incident).select_related("updated_by").first()
    if review is not None:
        return review, False
    if base_revision != 0:
        raise Conflict(f"Incident #{incident.pk} has no saved review; start from revision 0.")
    rows = [row for _, row in timeline_rows([incident.pk])[incident.pk]]
    size = JobSize.objects.filter(job_id=incident.job_id).first()
    durations = measure(rows, incident.first_time, incident.first_step, declared(size))
    text = draft(facts_of(incident), rows, durations)
    review = Review.objects.create(incident=incident, revision=1, updated_at=now, **text)
    content = {"status": ReviewStatus.DRAFT, **text, "follow_ups": []}
    ReviewRevision.objects.create(review=review, number=1, author=None, at=now, content=content)
    return review, True


def _check_editable(review: Review, clean: dict[str, Any], expected: int) -> None:
    if review.revision != expected:
        by = review.updated_by.get_username() if review.updated_by else "the system"
        raise Conflict(
            f"The review was saved by {by} as revision {review.revision} after revision "
            f"{expected} you started from; reload it and apply your edit again."
        )
    final = review.status == ReviewStatus.FINAL
    if final and frozen_part(clean) != frozen_part(stored_content(review)):
        raise Conflict("The review is final: only its follow-ups can still be marked done.")


def _write(review: Review, clean: dict[str, Any], user: User, now: datetime) -> None:
    """The content, the follow-ups and a new revision (a compare-and-swap on the number)."""
    number = review.revision + 1
    updated = Review.objects.filter(pk=review.pk, revision=review.revision).update(
        revision=number,
        updated_at=now,
        updated_by=user,
        **{name: clean[name] for name in TEXT_FIELDS},
    )
    if updated != 1:
        raise Conflict("The review was saved by somebody else meanwhile; reload it.")
    review.follow_ups.all().delete()
    owners = {u.get_username(): u for u in _users({f["owner"] for f in clean["follow_ups"]})}
    FollowUp.objects.bulk_create(
        FollowUp(
            review=review,
            position=position,
            text=item["text"],
            owner=owners.get(item["owner"]),
            due_date=date.fromisoformat(item["due_date"]) if item["due_date"] else None,
            done=item["done"],
        )
        for position, item in enumerate(clean["follow_ups"])
    )
    status = clean["status"] if review.status == ReviewStatus.DRAFT else review.status
    content = {**clean, "status": status}
    ReviewRevision.objects.create(
        review=review, number=number, author=user, at=now, content=content
    )
    review.refresh_from_db()


def _username(user: User | None) -> str | None:
    return user.get_username() if user is not None else None


def _users(usernames: set[str | None]) -> list[User]:
    names = {name for name in usernames if name}
    return list(get_user_model().objects.filter(username__in=names)) if names else []


def _finalize(review: Review, incident: Incident, user: User, now: datetime) -> None:
    """draft → final, and the incident resolved → reviewed, with its timeline row."""
    if incident.status != IncidentStatus.RESOLVED:
        raise Conflict(
            f"Incident #{incident.pk} is {incident.status}: its review can be marked final once "
            "the incident is resolved (every alert of the episode resolved). Save it as a "
            "draft meanwhile."
        )
    final = compare_and_swap(
        Review,
        review.pk,
        table=REVIEW_TRANSITIONS,
        expected=[ReviewStatus.DRAFT],
        new=ReviewStatus.FINAL,
        finalized_at=now,
    )
    won = final and compare_and_swap(
        Incident,
        incident.pk,
        table=INCIDENT_TRANSITIONS,
        expected=[IncidentStatus.RESOLVED],
        new=IncidentStatus.REVIEWED,
    )
    if not won:
        raise Conflict(f"Incident #{incident.pk} changed meanwhile; reload the review.")
    append_timeline(
        incident.pk,
        TimelineKind.NOTE,
        f"Review marked final by {user} (revision {review.revision}): the incident is reviewed",
        at=now,
        actor_kind=ActorKind.PERSON,
        actor=user,
        data={"event": "review_final", "review_id": review.pk, "revision": review.revision},
    )
    review.refresh_from_db()
