"""The monitoring page: outside alerts of my teams, the unrouted ones first (docs/monitoring.md)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from breakers.models import ExternalAlert, ExternalAlertStatus
from console.api.integrations import unrouted_alerts
from incidents.teams.access import visible_team_ids

RECENT = 50


@login_required
def monitoring_page(request: HttpRequest) -> HttpResponse:
    teams = visible_team_ids(request.user)
    routed = (
        ExternalAlert.objects.filter(team_id__in=teams, job__isnull=False)
        .select_related("job", "alert")
        .order_by("status", "-received_at")[: RECENT * 8]
    )
    context = {
        "unrouted": list(unrouted_alerts(request.user)[:RECENT]),
        "routed": _by_brakeline_alert(routed),
        "firing": ExternalAlertStatus.FIRING,
    }
    return render(request, "monitoring.html", context)


def _by_brakeline_alert(rows) -> list[dict]:
    """One line per Brakeline alert: the eight GPU alerts of a node are one alert of the job."""
    groups: dict[object, dict] = {}
    for row in rows:
        group = groups.setdefault(
            row.alert_id or f"row-{row.pk}",
            {"first": row, "gpus": [], "firing": 0, "count": 0},
        )
        group["count"] += 1
        group["firing"] += row.status == ExternalAlertStatus.FIRING
        if row.labels.get("gpu"):
            group["gpus"].append(row.labels["gpu"])
    for group in groups.values():
        group["gpus"] = sorted(set(group["gpus"]), key=lambda g: (len(g), g))
    return list(groups.values())[:RECENT]
