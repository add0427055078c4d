"""Whom the team's next L3 would reach, and what is missing: the "alerts of this team page
nobody" banner and the paging page's status both come from here.

It asks the same questions the round asks when an alert fires (``delivery._people_for_round``,
``channels_for``, ``delivery._address``), for the paging levels of the layers that page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils import timezone

from incidents.models import Contact, Team
from incidents.notifications.recipients import managers_of, notifications_configured, policy_for
from incidents.notifications.routing import DIGEST, channels_for
from incidents.teams.oncall import who_is_on_call

PAGING_LAYERS = ("health", "stability")


@dataclass
class Reach:
    team_id: int
    team: str
    pages_nobody: bool
    problems: list[str] = field(default_factory=list)  # what to fix, one sentence each
    reached: list[str] = field(default_factory=list)  # "olga by phone", "the team chat"


def _address(channel: str, person: Any, webhook: str, phones: dict[int, str]) -> str:
    if channel == "chat":
        return webhook
    if person is None:
        return ""
    return (person.email or "") if channel == "email" else phones.get(person.pk, "")


def paging_reach(team: Team, now: datetime | None = None) -> Reach:
    """Who an L3 of ``team`` raised at ``now`` pages in its first round, and the gaps."""
    now = now or timezone.now()
    reach = Reach(team.pk, team.name, pages_nobody=False)
    if not notifications_configured(team.pk):
        reach.pages_nobody = True
        reach.problems.append("The team has no notification policy.")
        return reach
    policy = policy_for(team.pk)
    people = _first_round_people(reach, team.pk, now)
    phones = _phones_of(people)
    reached: dict[str, None] = {}
    missing: dict[tuple[str, str], list[str]] = {}  # (person, address) -> channels failing
    for layer in PAGING_LAYERS:
        for channel in channels_for(policy.rules, layer, "L3"):
            if channel == DIGEST:
                continue
            targets = people[:1] if channel == "chat" else people
            for person in targets or [None]:
                if _address(channel, person, policy.chat_webhook_url, phones):
                    reached["the team chat" if channel == "chat" else f"{person} by {channel}"] = (
                        None
                    )
                elif channel == "chat":
                    _add(reach, "No chat webhook is set: chat pages fail.")
                elif person is not None:
                    what = "e-mail address" if channel == "email" else "phone number"
                    failing = missing.setdefault((str(person), what), [])
                    if channel not in failing:
                        failing.append(channel)
    for (person, what), failing in missing.items():
        _add(reach, f"{person} has no {what}: {' and '.join(failing)} pages to them fail.")
    reach.reached = list(reached)
    reach.pages_nobody = not reach.reached
    return reach


def _first_round_people(reach: Reach, team_id: int, now: datetime) -> list[Any]:
    """Whom a first round pages: the person on call, else the managers (a gap either way)."""
    on_call = who_is_on_call(team_id, now)[:1]
    people = on_call or managers_of(team_id)
    if not on_call:
        reach.problems.append(
            "Nobody is on call now: the managers are paged instead."
            if people
            else "Nobody is on call now and the team has no manager or admin."
        )
    return people


def _phones_of(people: list[Any]) -> dict[int, str]:
    return dict(
        Contact.objects.filter(user__in=[p.pk for p in people]).values_list("user_id", "phone")
    )


def _add(reach: Reach, problem: str) -> None:
    if problem not in reach.problems:
        reach.problems.append(problem)


def teams_paging_nobody(team_ids: list[int], now: datetime | None = None) -> list[Reach]:
    """The teams among ``team_ids`` whose L3 alerts would reach nobody at all."""
    teams = Team.objects.filter(pk__in=team_ids).order_by("name")
    return [r for r in (paging_reach(t, now) for t in teams) if r.pages_nobody]
