"""Shadow rules over REST: what they would have done (members) and their promotion to live
(admins), through the same services as the rules page (``breakers.detection.shadow``)."""

from __future__ import annotations

from datetime import timedelta

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from breakers.detection import shadow
from breakers.detection.shadow_report import shadow_report
from console.api.person_auth import PersonView, audit_context, error_responses, signed_in
from console.api.reviews import report_period
from console.api.rules import RuleSetOut, _ruleset, _team
from core.errors import InvalidInput

SHADOW_DEFAULT_DAYS = 7


class PromoteIn(serializers.Serializer):
    why = serializers.CharField(help_text="Why the rule goes live; kept with the new version.")


class ShadowReportView(PersonView):
    @extend_schema(
        tags=["rules"],
        summary="What the team's shadow rules would have done, against the real incidents",
        parameters=[
            OpenApiParameter("since", OpenApiTypes.STR, description="default: 7 days before until"),
            OpenApiParameter("until", OpenApiTypes.STR, description="default: now"),
        ],
        responses={200: OpenApiTypes.OBJECT, **error_responses(400, 401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        params = request.query_params
        unknown = sorted(set(params) - {"since", "until"})
        if unknown:
            raise InvalidInput(f"Unknown parameter {unknown[0]!r}.", fields={unknown[0]: "unknown"})
        since, until = report_period(params.get("since"), params.get("until"))
        if params.get("since") is None:
            since = until - timedelta(days=SHADOW_DEFAULT_DAYS)
        return Response(shadow_report(request.user, pk, since, until))


class PromoteView(PersonView):
    @extend_schema(
        tags=["rules"],
        summary="Promote a shadow rule to live: a new rule set version with its reason (admins)",
        request=PromoteIn,
        responses={201: RuleSetOut, **error_responses(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request, pk: int, key: str) -> Response:
        data = request.data if isinstance(request.data, dict) else {}
        unknown = sorted(set(map(str, data)) - {"why"})
        if unknown:
            raise InvalidInput(f"Unknown field {unknown[0]!r}.", fields={unknown[0]: "unknown"})
        shadow.promote_rule(
            signed_in(request), pk, key, data.get("why"), context=audit_context(request)
        )
        return Response(_ruleset(_team(request, pk)), status=201)
