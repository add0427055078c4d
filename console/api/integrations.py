"""The cluster's monitoring, in: Alertmanager's webhook, and the list of alerts that reached
no job ("unrouted": kept and shown, never dropped). docs/monitoring.md."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from breakers.models import ExternalAlert, ExternalAlertStatus
from breakers.monitoring.alertmanager import PayloadError, parse_webhook
from breakers.monitoring.receiver import authenticate_integration, receive_alertmanager
from breakers.monitoring.tokens import issue_integration_token, revoke_integration_token
from console.api.agent import RawJSONParser, read_json_body
from console.api.agent_auth import required_bearer_token
from console.api.agent_schema import ErrorDoc
from console.api.alerts import limit_param
from console.api.person_auth import PersonView, audit_context, error_responses
from console.ratelimit import parse_rate, rate_counter
from core.errors import InvalidInput, Unauthenticated
from incidents.models import Team
from incidents.teams.access import visible_team_ids


class IntegrationPrincipal:
    """The identity behind a webhook: the team its integration token belongs to."""

    is_authenticated = True

    def __init__(self, team: Team):
        self.team = team

    @property
    def pk(self) -> int:
        return self.team.pk


def integration_team(request: Request) -> Team:
    """The team whose integration token authenticated the request."""
    principal = request.user
    if not isinstance(principal, IntegrationPrincipal):
        raise Unauthenticated("No integration token: send 'Authorization: Bearer <token>'.")
    return principal.team


class IntegrationTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        token = required_bearer_token(get_authorization_header(request))
        return IntegrationPrincipal(authenticate_integration(token)), token

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="brakeline-integrations"'


class IntegrationTokenScheme(OpenApiAuthenticationExtension):
    target_class = "console.api.integrations.IntegrationTokenAuthentication"
    name = "integrationToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "`Bearer <integration token>`, a team's token for its monitoring "
            "(`manage.py integration_token <team>`).",
        }


WebhookDoc = inline_serializer(
    "AlertmanagerWebhook",
    {
        "version": serializers.CharField(help_text='"4"'),
        "groupKey": serializers.CharField(),
        "status": serializers.ChoiceField(choices=["firing", "resolved"]),
        "truncatedAlerts": serializers.IntegerField(min_value=0, required=False),
        "receiver": serializers.CharField(required=False),
        "alerts": serializers.ListField(child=serializers.DictField()),
    },
)
ReceivedDoc = inline_serializer(
    "AlertmanagerReceived",
    {
        "received": serializers.IntegerField(),
        "new": serializers.IntegerField(),
        "repeated": serializers.IntegerField(),
        "resolved": serializers.IntegerField(),
        "unrouted": serializers.IntegerField(),
        "alert_ids": serializers.ListField(child=serializers.IntegerField()),
        "truncated_alerts": serializers.IntegerField(),
    },
)


class WebhookRateThrottle(BaseThrottle):
    """Webhooks per team (``BRAKELINE_ALERTMANAGER_RATE``, default 60/min), answered with 429:
    a flood of webhooks never takes the workers and the database from everything else."""

    wait_seconds = 0.0

    def allow_request(self, request, view) -> bool:
        team = getattr(request.user, "team", None)
        if team is None:
            return True
        rate = api_settings.DEFAULT_THROTTLE_RATES["alertmanager"]
        limit, period = parse_rate(rate)  # type: ignore[arg-type]  # DRF's rates are "N/period" strings; its stubs type them as numbers
        try:
            self.wait_seconds = rate_counter().hit(f"alertmanager:{team.pk}", limit, period)
        except Exception:  # Redis away: the webhook is still applied (fails open)
            self.wait_seconds = 0.0
        return self.wait_seconds == 0

    def wait(self) -> float | None:
        return self.wait_seconds or None


class AlertmanagerWebhookView(APIView):
    authentication_classes = [IntegrationTokenAuthentication]
    permission_classes = [IsAuthenticated]
    throttle_classes = [WebhookRateThrottle]
    parser_classes = [RawJSONParser]
    renderer_classes = [JSONRenderer]

    @extend_schema(
        operation_id="alertmanager_webhook",
        request=WebhookDoc,
        responses={
            200: ReceivedDoc,
            **{
                code: OpenApiResponse(ErrorDoc, description=text)
                for code, text in {
                    400: "An invalid field (named in `fields`); nothing was written.",
                    401: "No token, an unknown or a revoked integration token.",
                    413: "Body over the limit; nothing was written.",
                    415: "Not application/json.",
                    429: "Too many webhooks of the team; retry after the Retry-After header.",
                }.items()
            },
        },
        tags=["integrations"],
        summary="Alertmanager's webhook (version 4): firing and resolved alerts",
    )
    def post(self, request: Request) -> Response:
        webhook = _parse(_body(request))
        report = receive_alertmanager(integration_team(request).pk, webhook)
        return Response({**report.as_dict(), "truncated_alerts": webhook.truncated_alerts})


def _body(request: Request) -> bytes:
    return read_json_body(request, "A webhook body holds at most {limit} bytes.")


def _parse(body: bytes):
    try:
        return parse_webhook(body)
    except PayloadError as error:
        raise InvalidInput(error.detail, fields=error.fields) from None


def external_alert_payload(row: ExternalAlert) -> dict[str, Any]:
    return {
        "id": row.pk,
        "team_id": row.team_id,
        "status": row.status,
        "alertname": row.alertname,
        "fingerprint": row.fingerprint,
        "node": row.node or None,
        "level": row.level,
        "why": row.why,
        "labels": row.labels,
        "annotations": row.annotations,
        "starts_at": row.starts_at.isoformat(),
        "received_at": row.received_at.isoformat(),
        "last_seen_at": row.last_seen_at.isoformat(),
        "repeats": row.repeats,
        "job_id": row.job_id,
        "alert_id": row.alert_id,
        "unrouted_reason": row.unrouted_reason,
    }


ExternalAlertListDoc = inline_serializer(
    "ExternalAlert",
    many=True,
    fields={
        "id": serializers.IntegerField(),
        "team_id": serializers.IntegerField(),
        "status": serializers.ChoiceField(choices=ExternalAlertStatus.choices),
        "alertname": serializers.CharField(),
        "fingerprint": serializers.CharField(),
        "node": serializers.CharField(allow_null=True),
        "level": serializers.CharField(),
        "why": serializers.CharField(),
        "labels": serializers.DictField(),
        "annotations": serializers.DictField(),
        "starts_at": serializers.DateTimeField(),
        "received_at": serializers.DateTimeField(),
        "last_seen_at": serializers.DateTimeField(),
        "repeats": serializers.IntegerField(),
        "job_id": serializers.IntegerField(allow_null=True),
        "alert_id": serializers.IntegerField(allow_null=True),
        "unrouted_reason": serializers.CharField(),
    },
)


def unrouted_alerts(user: Any):
    """Firing outside alerts of the user's teams that reached no job, newest first."""
    return ExternalAlert.objects.filter(
        team_id__in=visible_team_ids(user), status=ExternalAlertStatus.FIRING, job__isnull=True
    ).order_by("-received_at", "-pk")


class UnroutedAlertListView(PersonView):
    @extend_schema(
        tags=["integrations"],
        summary="Firing outside alerts of my teams that reached no job",
        responses={200: ExternalAlertListDoc, **error_responses(400, 401)},
    )
    def get(self, request: Request) -> Response:
        rows = unrouted_alerts(request.user)[: limit_param(request)]
        return Response([external_alert_payload(row) for row in rows])


class IntegrationTokenIn(serializers.Serializer):
    name = serializers.CharField(max_length=100, help_text="What sends with it (alertmanager).")


IssuedTokenDoc = inline_serializer(
    "IssuedIntegrationToken",
    {
        "id": serializers.IntegerField(),
        "team_id": serializers.IntegerField(),
        "name": serializers.CharField(),
        "prefix": serializers.CharField(),
        "token": serializers.CharField(help_text="Shown once: put it in Alertmanager's config."),
    },
)
RevokedTokenDoc = inline_serializer(
    "RevokedIntegrationToken",
    {"id": serializers.IntegerField(), "revoked_at": serializers.DateTimeField()},
)


class IntegrationTokenListView(PersonView):
    @extend_schema(
        tags=["integrations"],
        summary="Issue the team's integration token for Alertmanager (admins)",
        request=IntegrationTokenIn,
        responses={201: IssuedTokenDoc, **error_responses(400, 401, 403, 404)},
    )
    def post(self, request: Request, pk: int) -> Response:
        body = IntegrationTokenIn(data=request.data)
        body.is_valid(raise_exception=True)
        issued = issue_integration_token(
            request.user, pk, body.validated_data["name"], context=audit_context(request)
        )
        token = issued.token
        return Response(
            {
                "id": token.pk,
                "team_id": token.team_id,
                "name": token.name,
                "prefix": token.prefix,
                "token": issued.raw,
            },
            status=201,
        )


class IntegrationTokenView(PersonView):
    @extend_schema(
        tags=["integrations"],
        summary="Revoke an integration token (admins; twice is harmless)",
        responses={200: RevokedTokenDoc, **error_responses(401, 403, 404)},
    )
    def delete(self, request: Request, pk: int) -> Response:
        token = revoke_integration_token(request.user, pk, context=audit_context(request))
        return Response({"id": token.pk, "revoked_at": token.revoked_at})
