"""The snapshots page of a job: its readiness, its snapshots, and the diff between two.

``/jobs/<id>/snapshots/`` shows the latest resume against its checkpoint's snapshot (else the
two latest snapshots); ``?a=<id>&b=<id>`` any two. Team-scoped like every page; a bad or
foreign snapshot id is answered with the page and a sentence, never a 500.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from breakers.snapshots import queries
from console.api.jobs import visible_jobs
from core.errors import ServiceError


@login_required
def job_snapshots_page(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(visible_jobs(request.user), pk=pk)
    params = request.GET
    error, chosen = "", None
    try:
        chosen = queries.choose_diff(
            job.pk, params.get("a", ""), params.get("b", ""), params.get("diff", "")
        )
    except ServiceError as refused:
        error = " ".join([refused.detail, *refused.fields.values()])
    context = {
        "job": job,
        "snapshots": [queries.summary(row) for row in queries.job_snapshots(job.pk)],
        "chosen": chosen.as_dict() if chosen is not None else None,
        "error": error,
    }
    return render(request, "snapshots/job_snapshots.html", context, status=400 if error else 200)
