"""The review page (``/incidents/<id>/review/``) and a team's incident report page
(``/teams/<id>/report/``). Server-rendered and print-friendly; the write-up form posts to the
page itself and goes through the same service as the REST API (``incidents.reviews.writeup``).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from breakers.ledger import goodput_ledger
from breakers.metrics import points_between
from console.api.person_auth import audit_context, signed_in
from console.api.reviews import report_period
from console.pages.ledger import ledger_for_page
from console.review_chart import Chart, chart
from core.errors import Forbidden, InvalidInput, NotFound, ServiceError
from incidents.models import Membership
from incidents.reviews.content import MAX_FOLLOW_UPS, TEXT_FIELDS
from incidents.reviews.draft import actor_name
from incidents.reviews.durations import LINK_KEYS, Durations, Link, Row, format_seconds
from incidents.reviews.export import SECTION_TITLES, parse_iso
from incidents.reviews.report import team_incident_report
from incidents.reviews.writeup import ReviewData, load_review, may_edit, save_review

EMPTY_FOLLOW_UP_ROWS = 2
CURVE_MAX_ROWS = 20_000
EVENT_KINDS = {
    "first_anomalous_point": "first anomalous point",
    "alert_raised": "alert",
    "checkpoint_saved": "stopped",
    "terminated": "stopped",
    "resumed": "resumed",
}


@login_required
def incident_review(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        data = load_review(request.user, pk)
    except NotFound:
        raise Http404("There is no such incident in your teams.") from None
    errors: dict[str, str] = {}
    content = data.content
    if request.method == "POST":
        try:
            if not may_edit(request.user, data.incident):
                # Refused before the form is read (its size is the sender's choice); the
                # service says why and audits the attempt.
                save_review(
                    signed_in(request), pk, {}, base_revision=0, context=audit_context(request)
                )
            content = _posted_content(request)
            base = _form_count(request.POST.get("revision", "0"), "revision", 2**31)
            save_review(
                signed_in(request), pk, content, base_revision=base, context=audit_context(request)
            )
        except Forbidden as refusal:
            return render(request, "review_refused.html", {"reason": refusal.detail}, status=403)
        except ServiceError as error:
            errors = {"__all__": error.detail, **error.fields}
        except ValueError:
            errors = {"__all__": "The form was incomplete; reload the page."}
        else:
            return redirect("incident-review", pk=pk)
    return render(
        request,
        "review.html",
        _context(request, data, content, errors),
        status=400 if errors else 200,
    )


def _form_count(raw: str, name: str, most: int) -> int:
    """A whole number from the form, 0 ≤ n ≤ most; anything else is a refusal naming it."""
    raw = (raw or "0").strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 12 or int(raw) > most:
        raise InvalidInput(
            "The form was refused.", fields={name: f"a whole number from 0 to {most}"}
        )
    return int(raw)


def _posted_content(request: HttpRequest) -> dict[str, Any]:
    post = request.POST
    follow_ups = []
    rows = _form_count(
        post.get("follow_up_count", "0"), "follow_up_count", MAX_FOLLOW_UPS + EMPTY_FOLLOW_UP_ROWS
    )
    for index in range(rows):
        text = post.get(f"follow_up-{index}-text", "").strip()
        if not text:
            continue  # an empty row of the form: nothing to follow up
        follow_ups.append(
            {
                "text": text,
                "owner": post.get(f"follow_up-{index}-owner") or None,
                "due_date": post.get(f"follow_up-{index}-due_date") or None,
                "done": post.get(f"follow_up-{index}-done") == "on",
            }
        )
    return {
        "status": post.get("status", "draft"),
        **{name: post.get(name, "") for name in TEXT_FIELDS},
        "follow_ups": follow_ups,
    }


def _context(
    request: HttpRequest, data: ReviewData, content: dict[str, Any], errors: dict[str, str]
) -> dict[str, Any]:
    incident, review = data.incident, data.review
    final = review is not None and review.status == "final"
    follow_ups = list(content["follow_ups"]) + [
        {"text": "", "owner": None, "due_date": None, "done": False}
    ] * (0 if final else EMPTY_FOLLOW_UP_ROWS)
    return {
        "incident": incident,
        "job": incident.job,
        "review": review,
        "final": final,
        "content": content,
        "sections": [(name, SECTION_TITLES[name], content[name]) for name in TEXT_FIELDS],
        "follow_ups": follow_ups,
        "saved_follow_ups": [f for f in content["follow_ups"] if f["text"]],
        "members": _members(incident.job.team_id),
        "links": chain_bars(data.durations),
        "durations": data.durations,
        "accelerator_hours": data.durations.accelerator_hours,
        "rows": _rows(data.rows, incident.first_time),
        "recoveries": data.recoveries,
        "chart": _curve(data),
        "can_edit": may_edit(request.user, incident),
        "revisions": list(review.revisions.select_related("author")) if review else [],
        "errors": errors,
    }


def link_span(link: Link, origin: datetime | None) -> str:
    """From which event to which: "alert raised (+2.1 s) → checkpoint saved (+2.57 s)",
    the times from the first anomalous point."""

    def event(kind: str | None, moment: datetime | None) -> str:
        name = (kind or "").replace("_", " ")
        if moment is None or origin is None:
            return name
        return f"{name} (+{format_seconds((moment - origin).total_seconds())})"

    if not link.measured:
        return ""
    return f"{event(link.start_kind, link.start_at)} → {event(link.end_kind, link.end_at)}"


def chain_bars(durations: Durations) -> list[dict[str, Any]]:
    """One bar per link, its length relative to the slowest, which is marked."""
    slowest = durations.slowest
    longest = max((link.seconds for link in durations.links if link.seconds), default=0) or 1
    origin = durations.link("detect").start_at
    return [
        {
            "key": link.key,
            "label": link.label,
            "text": format_seconds(link.seconds),
            "steps": link.steps,
            "steps_phrase": link.steps_phrase,
            "measured": link.measured,
            "end_kind": (link.end_kind or "").replace("_", " "),
            "span": link_span(link, origin),
            "width": 0 if link.seconds is None else max(0.5, 100 * max(link.seconds, 0) / longest),
            "slowest": slowest is not None and link.key == slowest.key,
        }
        for link in durations.links
    ]


def _rows(rows: list[Row], first_at) -> list[dict[str, Any]]:
    return [
        {
            "at": row.at,
            "offset": format_seconds((row.at - first_at).total_seconds()),
            "kind": row.kind,
            "label": row.kind.replace("_", " "),
            "actor_kind": row.actor_kind,
            "actor": actor_name(row),
            "step": row.step,
            "message": row.message,
        }
        for row in rows
    ]


def _members(team_id: int) -> list[str]:
    return sorted(
        Membership.objects.filter(team_id=team_id).values_list("user__username", flat=True)
    )


def _curve(data: ReviewData) -> Chart | None:
    """The episode's metric around the incident: from a little before the first anomalous
    point to a little after the last step on the timeline."""
    incident = data.incident
    metric = incident.alerts.order_by("raised_at", "id").values_list("metric", flat=True).first()
    steps = [row.step for row in data.rows if row.step is not None] + [incident.first_step]
    span = max(max(steps) - min(steps), 1)
    low, high = min(steps) - max(50, span), max(steps) + max(50, span // 2)
    values: dict[int, list[float]] = {}
    for name in dict.fromkeys([metric or "loss", "loss"]):
        for step, value in points_between(incident.job_id, name, low, high, CURVE_MAX_ROWS):
            values.setdefault(step, []).append(value)
        if values:
            metric = name
            break
    # Several nodes report the same step: one value per step, non-finite if any node's was.
    points = [(step, _combine(vs)) for step, vs in values.items()]
    events = [
        (row.step, EVENT_KINDS[row.kind], row.kind)
        for row in data.rows
        if row.kind in EVENT_KINDS and row.step is not None
    ]
    return chart(points, events, metric=metric or "loss")


def _combine(values: list[float]) -> float:
    if any(not math.isfinite(value) for value in values):
        return math.nan
    return sum(values) / len(values)


@login_required
def team_report(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        since, until = report_period(request.GET.get("since"), request.GET.get("until"))
        report = team_incident_report(request.user, pk, since, until)
    except NotFound:
        raise Http404("There is no such team among yours.") from None
    except ServiceError as error:
        return render(request, "team_report.html", {"error": error.detail}, status=400)
    for level in report["levels"]:
        level["cells"] = [
            (
                key,
                format_seconds(stats["median"]) if stats["measured"] else "—",
                format_seconds(stats["p90"]) if stats["measured"] else "—",
                stats["measured"],
            )
            for key, stats in level["links"].items()
        ]
    for incident in report["incidents"]:
        incident["opened"] = parse_iso(incident["opened_at"])
        incident["cells"] = [
            (key, format_seconds(link["seconds"]), key == incident["slowest"])
            for key, link in incident["links"].items()
        ]
    return render(
        request,
        "team_report.html",
        {
            "report": report,
            "since": since,
            "until": until,
            "link_keys": LINK_KEYS,
            "ledger": ledger_for_page(goodput_ledger(request.user, pk, since, until)),
        },
    )
