"""Web pages (server-rendered; small plain JavaScript keeps them live)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from console.api.jobs import JobSerializer, visible_jobs


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    jobs = JobSerializer(visible_jobs(request.user), many=True).data
    return render(request, "dashboard.html", {"jobs": jobs})
