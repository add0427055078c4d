"""What every page's frame shows: the navigation (with the pending-approvals badge), the red
"alerts of this team page nobody" banner, and whether this person gets browser notifications
of new L3/L4 alerts (people who act on alerts: on-call and above)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from incidents.models import EscalationRequest, EscalationStatus, Membership
from incidents.notifications.reach import teams_paging_nobody
from incidents.teams.audit import audit_read_refusal
from incidents.teams.authority import Action, decide


def console(request: HttpRequest) -> dict[str, Any]:
    """Lazy: a page's live part (``?partial=``, fetched again on every event) never shows the
    frame, so it never pays for these queries."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    frame = SimpleLazyObject(lambda: _frame(user))
    return {
        "nav": SimpleLazyObject(lambda: frame["nav"]),
        "paging_nobody": SimpleLazyObject(lambda: frame["paging_nobody"]),
    }


def _frame(user: Any) -> dict[str, Any]:
    roles = dict(Membership.objects.filter(user=user).values_list("team_id", "role"))
    teams = [t for t, r in roles.items() if decide(r, Action.VIEW).allowed]
    pending = EscalationRequest.objects.filter(
        job__team_id__in=teams, status=EscalationStatus.PENDING
    ).count()
    return {
        "nav": {
            "pending_approvals": pending,
            "audit": any(audit_read_refusal(r) is None for r in roles.values()),
            "admin": user.is_staff,
            "outbox": bool(settings.NOTIFY_OUTBOX),
            "report_team": min(teams) if len(teams) == 1 else None,
            "notify_alerts": any(
                decide(r, Action.ACKNOWLEDGE_ALERT).allowed for r in roles.values()
            ),
            "team_ids": sorted(teams),
        },
        "paging_nobody": teams_paging_nobody(teams),
    }
