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
        .order_by("status", "-received_at")[:RECENT]
    )
    context = {
        "unrouted": list(unrouted_alerts(request.user)[:RECENT]),
        "routed": list(routed),
        "firing": ExternalAlertStatus.FIRING,
    }
    return render(request, "monitoring.html", context)
