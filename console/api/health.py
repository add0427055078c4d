"""GET /api/v1/health: is anything watching? The beat's age, the queue, the workers."""

from __future__ import annotations

import time

from celery import current_app
from django.conf import settings
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from breakers.control import liveness
from breakers.control.watchdog import BEAT
from breakers.detection.evaluation import BREAKERS_FAILING_RULE
from incidents.models import ACTIVE_ALERT_STATUSES, Alert

BEAT_STALE_SECONDS = 5.0
_worker_cache: dict[str, float] = {}


def worker_count() -> int:
    """Workers answering a ping (cached for a few seconds: a ping waits for answers)."""
    if settings.EMBEDDED:
        return 1  # tasks run in-process
    now = time.monotonic()
    if now - _worker_cache.get("at", 0.0) > 5.0:
        # The project's app (config/celery.py), as its shared tasks find it: nothing imports config.
        replies = current_app.control.ping(timeout=0.5) or []
        _worker_cache.update(at=now, count=float(len(replies)))
    return int(_worker_cache["count"])


def failing_breakers() -> list[dict]:
    """Jobs whose evaluation raises (their active "breakers failing" alert): nothing brakes
    them until somebody looks. This endpoint is public, so only ids and the time: the job's
    name and the error are in the alert, behind the console's authentication."""
    alerts = Alert.objects.filter(
        rule_key=BREAKERS_FAILING_RULE, status__in=ACTIVE_ALERT_STATUSES
    ).order_by("raised_at")[:100]
    return [
        {"job_id": alert.job_id, "alert_id": alert.pk, "since": alert.raised_at.isoformat()}
        for alert in alerts
    ]


def health_report(workers: int | None = None) -> tuple[dict, bool]:
    last_beat = liveness.last(BEAT)
    beat_age = None if last_beat is None else max(0.0, time.time() - last_beat)
    beat_stale = beat_age is None or beat_age > BEAT_STALE_SECONDS
    workers = worker_count() if workers is None else workers
    report = {
        "status": "ok",
        "mode": "embedded" if settings.EMBEDDED else "server",
        "beat": {"last_run_age_seconds": beat_age, "stale": beat_stale},
        "queue": {
            "name": settings.CELERY_TASK_DEFAULT_QUEUE,
            "depth": liveness.queue_depth(settings.CELERY_TASK_DEFAULT_QUEUE),
            "watchdog_depth": liveness.queue_depth(settings.WATCHDOG_QUEUE),
        },
        "workers": {"count": workers, "stale": workers == 0},
        "failing_breakers": failing_breakers(),
    }
    healthy = not beat_stale and workers > 0
    # A job whose breakers fail degrades the status; the answer stays 200 (503 says that
    # nothing watches at all, and a load balancer must not take the console away for it).
    report["status"] = "ok" if healthy and not report["failing_breakers"] else "degraded"
    return report, healthy


class HealthView(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(
        tags=["health"],
        responses={
            200: inline_serializer("Health", {"status": serializers.CharField()}),
            503: inline_serializer("Unhealthy", {"status": serializers.CharField()}),
        },
        summary="Age of the watchdog beat, queue depth, workers; 503 when beat or workers stale",
    )
    def get(self, request: Request) -> Response:
        report, healthy = health_report()
        return Response(report, status=200 if healthy else 503)
