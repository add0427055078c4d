"""The agent protocol's endpoints as DRF views (docs/protocol.md): what the OpenAPI schema
documents, and what serves agent requests that reach Django (the test client, WSGI,
``BRAKELINE_AGENT_LEAN=0``). Under Daphne the hot path's requests take the lean route
(console/agent_lean.py) to the same handlers (console/api/agent_endpoints.py)."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.parsers import BaseParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from breakers.agent.protocol import PROTOCOL_VERSION
from console.api.agent_auth import AgentRateThrottle, AgentTokenAuthentication, agent_job
from console.api.agent_endpoints import (
    TOO_LARGE,
    body_is_typed,
    check_content_type,
    command_ack,
    heartbeat,
    metrics,
)
from console.api.agent_schema import (
    AckDoc,
    AckedDoc,
    CommandsDoc,
    ErrorDoc,
    HeartbeatDoc,
    MetricsAcceptedDoc,
    MetricsBatchDoc,
)
from console.api.params import length_exceeds
from core.errors import PayloadTooLarge

ERRORS = {
    code: OpenApiResponse(ErrorDoc, description=text)
    for code, text in {
        400: "Malformed JSON or an invalid field; nothing was written.",
        401: "No token, an unknown token or a revoked one.",
        413: "Batch over the limit (points or bytes); nothing was written.",
        415: "A Content-Type other than application/json (UTF-8); nothing was written.",
        429: "Rate limit; retry after the Retry-After header.",
    }.items()
}


class RawJSONParser(BaseParser):
    """Declares JSON for the schema; the views read the raw body themselves (fast path)."""

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):  # pragma: no cover
        return stream.read()


def declares_more_than(request: Request, limit: int) -> bool:
    """The request's ``Content-Length`` says more than ``limit`` bytes (``length_exceeds``)."""
    return length_exceeds(request.META.get("CONTENT_LENGTH") or "0", limit)


def read_json_body(request: Request, too_large_message: str, typed: bool = True) -> bytes:
    """A JSON request body within ``AGENT_MAX_BATCH_BYTES``, read only when its declared
    length allows (a 413 naming ``body`` otherwise); ``typed``: check the Content-Type first.
    ``too_large_message`` may name the ``{limit}``."""
    if typed:
        check_content_type(request.META.get("CONTENT_TYPE", ""))
    limit = settings.AGENT_MAX_BATCH_BYTES
    too_large = PayloadTooLarge(
        too_large_message.format(limit=limit), fields={"body": f"at most {limit} bytes"}
    )
    if declares_more_than(request, limit):
        raise too_large
    try:
        body = request.body
    except RequestDataTooBig:
        raise too_large from None
    if len(body) > limit:
        raise too_large
    return body


class AgentView(APIView):
    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAuthenticated]
    throttle_classes = [AgentRateThrottle]
    parser_classes = [RawJSONParser]
    renderer_classes = [JSONRenderer]

    def finalize_response(self, request, response, *args, **kwargs):
        # The protocol's version (docs/protocol.md "Versions"): 2 stores a batch id once.
        response = super().finalize_response(request, response, *args, **kwargs)
        response["Brakeline-Protocol"] = str(PROTOCOL_VERSION)
        return response

    def raw_body(self, request: Request) -> bytes:
        """The request body, read only now: after authentication, permission and the rate
        limit (DRF's ``initial``), and only when it is JSON within the byte limit."""
        declared = request.META.get("CONTENT_LENGTH") or "0"
        typed = body_is_typed(declared, request.META.get("CONTENT_TYPE", ""))
        return read_json_body(request, TOO_LARGE, typed=typed)


class MetricsView(AgentView):
    @extend_schema(
        operation_id="agent_metrics",
        request=MetricsBatchDoc,
        responses={202: MetricsAcceptedDoc, **ERRORS},
        tags=["agent"],
        summary="Upload a batch of metric points",
    )
    def post(self, request: Request) -> Response:
        status, reply = metrics(agent_job(request), self.raw_body(request), None)
        return Response(reply, status=status)


class HeartbeatView(AgentView):
    @extend_schema(
        operation_id="agent_heartbeat",
        request=HeartbeatDoc,
        responses={200: CommandsDoc, **ERRORS},
        tags=["agent"],
        summary="Report that the training process is alive",
    )
    def post(self, request: Request) -> Response:
        status, reply = heartbeat(agent_job(request), self.raw_body(request), None)
        return Response(reply, status=status)


class CommandAckView(AgentView):
    @extend_schema(
        operation_id="agent_command_ack",
        request=AckDoc,
        responses={
            200: AckedDoc,
            404: OpenApiResponse(ErrorDoc, description="Not this job's."),
            **ERRORS,
        },
        tags=["agent"],
        summary="Acknowledge a command with its result (twice is harmless)",
    )
    def post(self, request: Request, command_id: int) -> Response:
        status, reply = command_ack(agent_job(request), self.raw_body(request), command_id)
        return Response(reply, status=status)
