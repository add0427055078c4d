"""Whom a page reaches and where: the team's policy, the person on call (or the drill's
receivers), the managers of a later round, and each person's address on a channel."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from incidents.models import (
    Contact,
    DrillDelivery,
    Membership,
    NotificationPolicy,
    Role,
)
from incidents.teams.oncall import who_is_on_call


def policy_for(team_id: int) -> NotificationPolicy:
    """The team's policy; the default policy (unsaved) when it has none (docs/design.md
    "Notifications and paging")."""
    policy = NotificationPolicy.objects.filter(team_id=team_id).first()
    return policy if policy is not None else NotificationPolicy(team_id=team_id)


def notifications_configured(team_id: int) -> bool:
    return NotificationPolicy.objects.filter(team_id=team_id).exists()


def people_to_page(
    team_id: int,
    number: int,
    now: datetime,
    *,
    drill: bool,
    policy: NotificationPolicy | None = None,
) -> list[Any]:
    """Whom round ``number`` of an alert of the team pages: the one rule, asked by the round
    and by the drill runner (which checks that the page reached them).

    A fire drill's alert (``drill``: its job is a drill sandbox) of a team whose policy sends
    drills to its drill receivers pages those receivers in every round, in id order, so a
    drill never wakes the on-call; receivers who have since left the team are skipped, and
    when none is left the drill pages as any alert does (a drill must reach somebody)."""
    policy = policy if policy is not None else policy_for(team_id)
    if drill and policy.pk is not None and policy.drill_delivery == DrillDelivery.RECEIVERS:
        receivers = policy.drill_receivers.filter(memberships__team_id=team_id).distinct()
        people = list(receivers.order_by("id"))
        if people:
            return people
    return people_for_round(team_id, number, now)


def people_for_round(team_id: int, number: int, now: datetime) -> list[Any]:
    """Round 0: the person on call (the managers when nobody is); later rounds: the managers."""
    on_call = who_is_on_call(team_id, now)[:1]
    if number == 0 and on_call:
        return on_call
    return managers_of(team_id)


def managers_of(team_id: int) -> list[Any]:
    """The team's managers; its admins when it has none (someone must be reachable)."""
    for role in (Role.MANAGER, Role.ADMIN):
        members = Membership.objects.filter(team_id=team_id, role=role).select_related("user")
        people = [m.user for m in members.order_by("id")]
        if people:
            return people
    return []


def address_for(channel: str, person: Any, policy: NotificationPolicy) -> str:
    if channel == "chat":
        return policy.chat_webhook_url
    if channel == "email":
        return person.email or ""
    contact = Contact.objects.filter(user=person).first()
    return contact.phone if contact is not None else ""
