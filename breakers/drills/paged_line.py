"""The scorecard's "paged" line: whom the drill's alert reached in its first round, and whom
the team's policy says it should have reached."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet

from incidents.models import Alert, Delivery, Job, NotificationPolicy
from incidents.notifications.grouping import PAGES_ALONE
from incidents.notifications.recipients import people_to_page
from incidents.notifications.routing import DIGEST, channels_for
from incidents.teams.oncall import who_is_on_call


def _round_zero(alert: Alert) -> QuerySet[Delivery]:
    """The deliveries of the page this alert was part of, at its level."""
    # An alert storm pages once per incident and level, through whichever of its alerts was
    # dispatched first (the NaN's L3 or the guard's): that round is this alert's page too.
    # A failed brake pages on its own, through its own layer's channels: not this line's.
    deliveries = Delivery.objects.filter(round__number=0, round__severity=alert.severity).exclude(
        alert__rule_key__in=PAGES_ALONE
    )
    if alert.incident_id is not None:
        return deliveries.filter(alert__incident_id=alert.incident_id)
    return deliveries.filter(alert=alert)


def paging_facts(job: Job, alert: Alert, wait_until: Callable[..., Any]) -> dict[str, Any]:
    """What round 0 of the drill's alert did against what the team's policy says it should
    have: channels, people, the DRILL mark, failures. ``wait_until``: the runner's wait, which
    a stopped runner cuts short."""
    policy = NotificationPolicy.objects.filter(team_id=job.team_id).first()
    if policy is None:
        return {"policy": False}
    deliveries = _round_zero(alert)
    # Until round 0 exists and none of its deliveries is still on its way: a dispatch that has
    # not run yet has no rows, and "none queued" alone would read that as "nobody paged".
    sending = deliveries.filter(status="queued")
    wait_until(lambda: deliveries.exists() and not sending.exists(), "the deliveries", 45)
    wanted = [c for c in channels_for(policy.rules, alert.layer, alert.severity) if c != DIGEST]
    people = people_to_page(job.team_id, 0, alert.raised_at, drill=True, policy=policy)
    sent = list(deliveries.select_related("recipient"))
    alert.refresh_from_db()
    rounds = alert.notification_rounds.count()
    return {
        "detail": f"alert {alert.status}, {rounds} round(s), {len(sent)} deliveries in round 0",
        "policy": True,
        "receivers": policy.drill_delivery == "receivers",
        "on_call": bool(who_is_on_call(job.team_id, alert.raised_at)),
        "expected_channels": wanted,
        "expected_people": ", ".join(sorted(p.get_username() for p in people)) or "nobody",
        "paged_channels": sorted({d.channel for d in sent if d.status != "failed"}),
        "paged_people": ", ".join(sorted({d.recipient.get_username() for d in sent if d.recipient}))
        or "nobody",
        "people_ok": {d.recipient_id for d in sent} == {p.pk for p in people},
        "all_marked_drill": bool(sent)
        and all(d.purpose == "drill" and d.first_line.startswith("DRILL") for d in sent),
        "failed": [
            f"{d.channel} to {d.address or '?'} ({d.provider_response[:80]})"
            for d in sent
            if d.status == "failed"
        ],
    }
