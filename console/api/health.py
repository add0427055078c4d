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
    }
    healthy = not beat_stale and workers > 0
    report["status"] = "ok" if healthy else "degraded"
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
