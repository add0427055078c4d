"""``GET /metrics``: Brakeline's own state in Prometheus' text format (prometheus_client).

Protected: with ``BRAKELINE_METRICS_TOKEN`` set, Prometheus sends it as a bearer token
(``authorization: {credentials: …}`` in the scrape config); without it the endpoint answers
404 unless ``BRAKELINE_METRICS_PUBLIC=true`` says it is only reachable on an internal network.
The figures name jobs' counts, never jobs or people, but they are still nobody else's business.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from breakers.monitoring.exposition import registry


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.METRICS_TOKEN
    if not token and not settings.METRICS_PUBLIC:
        return JsonResponse(
            {"error": "not_found", "detail": "Set BRAKELINE_METRICS_TOKEN to expose /metrics."},
            status=404,
        )
    if token:
        scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(sent.strip(), token):
            response = JsonResponse(
                {"error": "unauthenticated", "detail": "Send 'Authorization: Bearer <token>'."},
                status=401,
            )
            response["WWW-Authenticate"] = 'Bearer realm="brakeline-metrics"'
            return response
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)
