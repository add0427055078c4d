"""GET /api/v1/health: is anything watching? The beat's age, the queue, the workers, and
whether the database and Redis answer at all (each part is asked on its own: one that is down
makes the answer 503 naming it, never a 500)."""

from __future__ import annotations

import logging
import time

from celery import current_app
from django.conf import settings
from django.db import Error as DatabaseError
from django.db import connection
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from breakers.control import liveness
from breakers.control.hearing import hearing_state
from breakers.control.watchdog import BEAT
from breakers.detection.evaluation import BREAKERS_FAILING_RULE
from console.api.errors import database_recently_away, outage_part
from incidents.models import ACTIVE_ALERT_STATUSES, Alert

BEAT_STALE_SECONDS = 5.0
# A console that has just started has not heard its beat yet: for HEALTH_STARTING_SECONDS it
# answers "starting" (503: not ready, as a readiness probe expects) without an error logged.
_STARTED_AT = time.monotonic()
_worker_cache: dict[str, float] = {}
log = logging.getLogger(__name__)


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


def _redis_part() -> tuple[dict, dict, float | None]:
    """(redis, queue, last beat): all read from Redis, all unknown while it is down."""
    queue: dict = {"name": settings.CELERY_TASK_DEFAULT_QUEUE, "depth": None}
    try:
        last_beat = liveness.last(BEAT)
        queue["depth"] = liveness.queue_depth(settings.CELERY_TASK_DEFAULT_QUEUE)
        queue["watchdog_depth"] = liveness.queue_depth(settings.WATCHDOG_QUEUE)
    except Exception as error:  # redis-py's errors, whatever the client version raises
        return {"ok": False, "error": type(error).__name__}, queue, None
    return {"ok": True}, queue, last_beat


def _database_part() -> tuple[dict, list[dict]]:
    """Reachable, and writable: a read-only database (a standby, or one set read-only) takes
    no metric, no heartbeat and no brake."""
    if database_recently_away():
        return {"ok": False, "error": "unreachable"}, []
    try:
        failing = failing_breakers()
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT current_setting('transaction_read_only')")
                if cursor.fetchone()[0] == "on":
                    return {"ok": False, "error": "read_only"}, failing
        return {"ok": True, "hearing": hearing_state()}, failing
    except DatabaseError as error:
        outage_part(error)  # noted: the next requests do not wait for the pool again
        connection.close_if_unusable_or_obsolete()
        return {"ok": False, "error": type(error).__name__}, []


def _workers(redis_ok: bool) -> int:
    if not redis_ok:
        return 0  # no broker: no worker can be reached, nor receive anything
    try:
        return worker_count()
    except Exception:  # the broker went away between the two questions
        return 0


def health_report(workers: int | None = None) -> tuple[dict, bool]:
    redis_part, queue, last_beat = _redis_part()
    database_part, failing = _database_part()
    beat_age = None if last_beat is None else max(0.0, time.time() - last_beat)
    beat_stale = beat_age is None or beat_age > BEAT_STALE_SECONDS
    workers = _workers(redis_part["ok"]) if workers is None else workers
    report = {
        "status": "ok",
        "mode": "embedded" if settings.EMBEDDED else "server",
        "database": database_part,
        "redis": redis_part,
        "beat": {"last_run_age_seconds": beat_age, "stale": beat_stale},
        "queue": queue,
        "workers": {"count": workers, "stale": workers == 0},
        "failing_breakers": failing,
    }
    healthy = not beat_stale and workers > 0 and redis_part["ok"] and database_part["ok"]
    # A job whose breakers fail degrades the status; the answer stays 200 (503 says that
    # nothing watches at all, and a load balancer must not take the console away for it).
    report["status"] = "ok" if healthy and not report["failing_breakers"] else "degraded"
    if not healthy and _starting(report):
        report["status"] = "starting"
    return report, healthy


def _starting(report: dict) -> bool:
    """This process started moments ago and its database and Redis answer: only the beat (or
    a worker) has not been heard yet."""
    return (
        time.monotonic() - _STARTED_AT < settings.HEALTH_STARTING_SECONDS
        and report["database"]["ok"]
        and report["redis"]["ok"]
    )


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
        response = Response(report, status=200 if healthy else 503)
        if report["status"] == "starting":
            # Expected at every start: not an error (Django logs every 5xx as one).
            response._has_been_logged = True  # type: ignore[attr-defined]
            log.info("health: starting (the watchdog beat has not run yet)")
        return response
