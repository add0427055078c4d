"""Teams and their paging: who the next L3 reaches, the policy, contacts, on-call shifts and
a "send a test page" button (the same service as the API's)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime, time, timedelta
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone

from console.api.notifications import delivery_out, is_admin, policy_out
from console.api.person_auth import audit_context, signed_in
from console.pages.forms import attempt, int_field, utc_field
from core.errors import InvalidInput
from incidents.models import Contact, Delivery, DrillDelivery, Membership, OnCallRotation, Team
from incidents.notifications.policy import save_policy, send_test_notification, set_contact
from incidents.notifications.reach import paging_reach
from incidents.notifications.routing import CHANNELS, DIGEST, LEVELS
from incidents.teams.access import role_in_team, visible_team_ids
from incidents.teams.authority import Action, decide
from incidents.teams.oncall import (
    create_rotation,
    create_shift,
    delete_rotation,
    delete_shift,
    rotation_spec,
    team_shifts,
    who_is_on_call,
)
from incidents.teams.rotation import rotation_person

GRID_LAYERS = ("health", "stability")
GRID_CHANNELS = {"health": CHANNELS, "stability": CHANNELS}


@login_required
def teams_page(request: HttpRequest) -> HttpResponse:
    ids = visible_team_ids(request.user)
    rows = []
    for team in Team.objects.filter(pk__in=ids).order_by("name"):
        rows.append(
            {
                "team": team,
                "role": role_in_team(request.user, team.pk),
                "reach": paging_reach(team),
                "on_call": who_is_on_call(team.pk)[:1],
            }
        )
    return render(request, "teams.html", {"rows": rows})


def _team(request: HttpRequest, pk: int) -> Team:
    team = Team.objects.filter(pk=pk, pk__in=visible_team_ids(request.user)).first()
    if team is None:
        raise Http404("There is no such team.")
    return team


def policy_grid(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per layer and channel, the lowest level that uses it ("" when none): the form's cells."""
    grid = []
    for layer in GRID_LAYERS:
        cells = []
        for channel in GRID_CHANNELS[layer]:
            levels = [
                r["min_level"] for r in rules if r["layer"] == layer and channel in r["channels"]
            ]
            cells.append({"channel": channel, "level": min(levels, default="")})
        grid.append({"layer": layer, "cells": cells})
    return grid


def rules_from_form(request: HttpRequest) -> list[dict[str, Any]]:
    """The grid back into rules: one rule per layer, level and channel chosen."""
    rules = []
    for layer in GRID_LAYERS:
        for channel in GRID_CHANNELS[layer]:
            level = request.POST.get(f"rule-{layer}-{channel}", "")
            if level in LEVELS:
                rules.append({"layer": layer, "min_level": level, "channels": [channel]})
    if request.POST.get("digest"):
        rules.append({"layer": "performance", "min_level": "L1", "channels": [DIGEST]})
    return rules


def _save_policy(request: HttpRequest, team: Team) -> None:
    timeout = request.POST.get("ack_timeout_seconds", "").strip()
    receivers = request.POST.getlist("drill_receivers")
    body = {
        "rules": rules_from_form(request),
        "chat_webhook_url": request.POST.get("chat_webhook_url", "").strip(),
        "chat_format": request.POST.get("chat_format", ""),
        "ack_timeout_seconds": int(timeout) if timeout.isdigit() else timeout,
        "drill_delivery": request.POST.get("drill_delivery", "on_call"),
        "drill_receivers": [int(v) if v.isdigit() else v for v in receivers],
    }
    save_policy(signed_in(request), team.pk, body, context=audit_context(request))


def _set_contact(request: HttpRequest, team: Team) -> None:
    person = int_field(request, "user_id") or 0
    phone = request.POST.get("phone", "")
    set_contact(signed_in(request), team.pk, person, phone, context=audit_context(request))


def _create_shift(request: HttpRequest, team: Team) -> None:
    create_shift(
        signed_in(request),
        team.pk,
        person_id=int_field(request, "user_id") or 0,
        starts_at=utc_field(request, "starts_at"),
        ends_at=utc_field(request, "ends_at"),
        context=audit_context(request),
    )


def _delete_shift(request: HttpRequest, team: Team) -> None:
    shift = int_field(request, "shift_id") or 0
    delete_shift(signed_in(request), team.pk, shift, context=audit_context(request))


def _delete_rotation(request: HttpRequest, team: Team) -> None:
    rotation = int_field(request, "rotation_id") or 0
    delete_rotation(signed_in(request), team.pk, rotation, context=audit_context(request))


def _send_test(request: HttpRequest, team: Team) -> None:
    person = int_field(request, "user_id") or 0
    channel = request.POST.get("channel", "")
    send_test_notification(
        signed_in(request), team.pk, person, channel, context=audit_context(request)
    )


def _people_by_name(team: Team, names: str) -> list[int]:
    """ "alice, bob, carol" (turn order) into the members' ids; InvalidInput naming a stranger."""
    ids = dict(Membership.objects.filter(team=team).values_list("user__username", "user_id"))
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in ids]
    if unknown:
        raise InvalidInput(
            f"Not members of {team.name}: {', '.join(unknown)}.",
            fields={"people": "usernames of the team's members, comma-separated"},
        )
    return [ids[name] for name in wanted]


def _create_rotation(request: HttpRequest, team: Team) -> None:
    post = request.POST
    handoff = _parsed(post.get("handoff_time", ""), time.fromisoformat, "handoff_time", "HH:MM")
    starts_on = _parsed(post.get("starts_on", ""), date.fromisoformat, "starts_on", "a date")
    length = post.get("length_days", "").strip()
    create_rotation(
        signed_in(request),
        team.pk,
        name=post.get("name", ""),
        people=_people_by_name(team, post.get("people", "")),
        length_days=int(length) if length.isdigit() else 0,
        handoff_time=handoff,
        time_zone=post.get("time_zone", "").strip(),
        starts_on=starts_on,
        context=audit_context(request),
    )


# The paging page's forms: what each does, and what the page says when it is done.
_FORMS: dict[str, tuple[str, Callable[[HttpRequest, Team], Any]]] = {
    "policy": ("Notification policy saved.", _save_policy),
    "contact": ("Phone number saved.", _set_contact),
    "shift": ("Shift added.", _create_shift),
    "delete_shift": ("Shift removed.", _delete_shift),
    "rotation": ("Rotation added.", _create_rotation),
    "delete_rotation": ("Rotation removed.", _delete_rotation),
    "test": ("Test page queued: its delivery is listed below.", _send_test),
}


def _post(request: HttpRequest, team: Team) -> None:
    form = _FORMS.get(request.POST.get("form", ""))
    if form is not None:
        done, action = form
        attempt(request, done, lambda: action(request, team))


def _parsed(raw: str, parse: Callable[[str], Any], name: str, expected: str) -> Any:
    try:
        return parse(raw.strip())
    except ValueError:
        raise InvalidInput(f"{name} must be {expected}.", fields={name: expected}) from None


def rotation_rows(team: Team, now: datetime) -> list[dict[str, Any]]:
    """The team's rotations as the page lists them: people in turn order, whose turn it is."""
    names = dict(Membership.objects.filter(team=team).values_list("user_id", "user__username"))
    rows = []
    for row in OnCallRotation.objects.filter(team=team).order_by("id"):
        spec = rotation_spec(row)
        current = rotation_person(spec, now)
        rows.append(
            {
                "rotation": row,
                "people": [names.get(p, f"#{p} (left)") for p in row.people],
                "current": names.get(current, "") if current is not None else "",
            }
        )
    return rows


def _members(team: Team) -> list[dict[str, Any]]:
    members = (
        Membership.objects.filter(team=team)
        .select_related("user")
        .order_by("role", "user__username")
    )
    phones = dict(
        Contact.objects.filter(user__memberships__team=team).values_list("user_id", "phone")
    )
    return [{"user": m.user, "role": m.role, "phone": phones.get(m.user_id, "")} for m in members]


def _paging_context(request: HttpRequest, team: Team, admin: bool) -> dict[str, Any]:
    """Who the next page reaches and how: the policy, the people, the shifts and rotations."""
    role = role_in_team(request.user, team.pk)
    policy = policy_out(team.pk, admin=admin)
    now = timezone.now()
    return {
        "role": role,
        "admin": admin,
        "manages_shifts": decide(role, Action.MANAGE_SHIFTS).allowed,
        "reach": paging_reach(team, now),
        "policy": policy,
        "grid": policy_grid(policy["rules"]),
        "digest": any(r["layer"] == "performance" for r in policy["rules"]),
        "drill_deliveries": DrillDelivery.choices,
        "receiver_ids": {r["id"] for r in policy["drill_receivers"]},
        "levels": LEVELS,
        "channels": CHANNELS,
        "members": _members(team),
        "on_call": who_is_on_call(team.pk, now),
        "shifts": team_shifts(team, ending_after=now),
        "rotations": rotation_rows(team, now),
        "shift_start": now.strftime("%Y-%m-%d %H:%M"),
        "shift_end": (now + timedelta(hours=12)).strftime("%Y-%m-%d %H:%M"),
    }


@login_required
def paging_page(request: HttpRequest, pk: int) -> HttpResponse:
    team = _team(request, pk)
    if request.method == "POST":
        _post(request, team)
        return redirect(f"/teams/{team.pk}/paging/")
    admin = is_admin(request.user, team.pk)
    tests = Delivery.objects.filter(team=team, purpose="test").select_related("recipient")
    context = {
        "team": team,
        "tests": [delivery_out(d, admin=admin) for d in tests.order_by("-id")[:10]],
    }
    if request.GET.get("partial") == "tests":
        return render(request, "partials/test_deliveries.html", context)
    context.update(_paging_context(request, team, admin))
    return render(request, "paging.html", context)
