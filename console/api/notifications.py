"""Notifications: a team's policy (admins change it), contacts, test messages, deliveries."""

from __future__ import annotations

import hmac
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.parsers import FormParser
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.person_auth import PersonView, audit_context, error_responses, signed_in
from incidents.models import Alert, Delivery, DrillDelivery, Severity, Team
from incidents.notifications.policy import (
    MAX_DRILL_RECEIVERS,
    ask_for_confirmation,
    save_policy,
    send_test_notification,
    set_contact,
)
from incidents.notifications.receipts import last_delivered, record_receipt
from incidents.notifications.recipients import notifications_configured, policy_for
from incidents.notifications.replies import (
    acknowledge_by_keypress,
    acknowledge_by_sms,
    verify_provider_request,
)
from incidents.notifications.reply_codes import SIGNATURE_HEADER, TIMESTAMP_HEADER
from incidents.notifications.routing import CHANNELS
from incidents.notifications.senders import provider_signature, receipt_url
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.authority import Action, decide


class RuleDoc(serializers.Serializer):
    layer = serializers.ChoiceField(choices=["health", "stability", "performance"])
    min_level = serializers.ChoiceField(choices=Severity.choices, default="L1")
    channels = serializers.ListField(child=serializers.CharField())


class PolicyIn(serializers.Serializer):
    rules = RuleDoc(
        many=True,
        required=False,
        help_text="L3 and L4 health and stability alerts must reach ≥ 2 channels, one phone.",
    )
    chat_webhook_url = serializers.CharField(required=False, allow_blank=True)
    chat_format = serializers.ChoiceField(choices=["generic", "slack"], required=False)
    ack_timeout_seconds = serializers.IntegerField(required=False)
    escalate_min_level = serializers.ChoiceField(choices=Severity.choices, required=False)
    drill_delivery = serializers.ChoiceField(
        choices=DrillDelivery.choices,
        required=False,
        help_text="Whom a fire drill's page reaches: on_call (as any alert) or receivers.",
    )
    drill_receivers = serializers.ListField(
        child=serializers.IntegerField(),
        required=False,
        max_length=MAX_DRILL_RECEIVERS,
        help_text="User ids of the team's members a drill pages when drill_delivery is receivers.",
    )


class ReceiverOut(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()


class PolicyOut(PolicyIn):
    drill_receivers = ReceiverOut(many=True)  # type: ignore[assignment]
    chat_webhook_url = serializers.CharField(
        help_text='Admins see the URL; other members "(set)" or "" (it is a secret).'
    )
    team_id = serializers.IntegerField()
    configured = serializers.BooleanField(help_text="False: the default policy, nobody is paged.")
    last_delivered = serializers.DictField(
        child=serializers.DateTimeField(allow_null=True),
        help_text="Per channel, when the team's last delivery got through.",
    )


class ContactIn(serializers.Serializer):
    phone = serializers.CharField(allow_blank=True, help_text="E.164, e.g. +15551234567")


class TestIn(serializers.Serializer):
    user_id = serializers.IntegerField()
    channel = serializers.ChoiceField(choices=list(CHANNELS))


class DeliveryOut(serializers.Serializer):
    id = serializers.IntegerField()
    alert_id = serializers.IntegerField(allow_null=True)
    channel = serializers.CharField()
    recipient = serializers.CharField(allow_null=True)
    purpose = serializers.CharField()
    status = serializers.CharField()
    attempts = serializers.IntegerField()
    first_line = serializers.CharField()
    provider_response = serializers.CharField(
        help_text="What the provider or webhook answered (truncated); admins only, else empty."
    )
    latency_ms = serializers.FloatField(allow_null=True)
    created_at = serializers.DateTimeField()
    delivered_at = serializers.DateTimeField(allow_null=True)


def is_admin(user: Any, team_id: int) -> bool:
    """May ``user`` see the team's secrets (the webhook URL, what providers answered)?"""
    return decide(role_in_team(user, team_id), Action.MANAGE_NOTIFICATIONS).allowed


def policy_out(team_id: int, *, admin: bool) -> dict[str, Any]:
    """The webhook URL is a secret (whoever knows it may post to the team's chat): admins see
    it, other members see whether one is set ("" when not, "(set)" when it is)."""
    policy = policy_for(team_id)
    url = policy.chat_webhook_url
    return {
        "team_id": team_id,
        "configured": notifications_configured(team_id),
        "rules": policy.rules,
        "chat_webhook_url": url if admin or not url else "(set)",
        "chat_format": policy.chat_format,
        "ack_timeout_seconds": policy.ack_timeout_seconds,
        "escalate_min_level": policy.escalate_min_level,
        "drill_delivery": policy.drill_delivery,
        "drill_receivers": [
            {"id": person.pk, "username": person.get_username()}
            for person in (policy.drill_receivers.order_by("id") if policy.pk else [])
        ],
        "last_delivered": last_delivered(team_id),
    }


def delivery_out(delivery: Delivery, *, admin: bool) -> dict[str, Any]:
    """What the provider or webhook answered is for admins (it may be anything the far end
    says); other members see "" there."""
    recipient = delivery.recipient
    return {
        "id": delivery.pk,
        "alert_id": delivery.alert_id,
        "channel": delivery.channel,
        "recipient": recipient.get_username() if recipient is not None else None,
        "purpose": delivery.purpose,
        "status": delivery.status,
        "attempts": delivery.attempts,
        "first_line": delivery.first_line,
        "provider_response": delivery.provider_response if admin else "",
        "latency_ms": delivery.latency_ms,
        "created_at": delivery.created_at.isoformat(),
        "delivered_at": delivery.delivered_at.isoformat() if delivery.delivered_at else None,
    }


class PolicyView(PersonView):
    @extend_schema(
        tags=["notifications"],
        summary="The team's notification policy and last delivery per channel (members)",
        responses={200: PolicyOut, **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        team = scoped_get(Team.objects, request.user, pk, team_path="id", noun="team")
        return Response(policy_out(team.pk, admin=is_admin(request.user, team.pk)))

    @extend_schema(
        tags=["notifications"],
        summary="Change the team's notification policy (admins)",
        request=PolicyIn,
        responses={200: PolicyOut, **error_responses(400, 401, 403, 404)},
    )
    def put(self, request: Request, pk: int) -> Response:
        data = request.data if isinstance(request.data, dict) else {}
        policy = save_policy(signed_in(request), pk, dict(data), context=audit_context(request))
        return Response(policy_out(policy.team_id, admin=True))


class ContactView(PersonView):
    @extend_schema(
        tags=["notifications"],
        summary="Set a member's phone number for SMS and calls (admins)",
        request=ContactIn,
        responses={204: None, **error_responses(400, 401, 403, 404)},
    )
    def put(self, request: Request, pk: int, user_id: int) -> Response:
        body = ContactIn(data=request.data)
        body.is_valid(raise_exception=True)
        set_contact(
            signed_in(request),
            pk,
            user_id,
            body.validated_data["phone"],
            context=audit_context(request),
        )
        return Response(status=204)


class TestNotificationView(PersonView):
    @extend_schema(
        tags=["notifications"],
        summary="Send a test message to one member on one channel (admins)",
        request=TestIn,
        responses={202: DeliveryOut, **error_responses(400, 401, 403, 404)},
    )
    def post(self, request: Request, pk: int) -> Response:
        body = TestIn(data=request.data)
        body.is_valid(raise_exception=True)
        delivery = send_test_notification(
            signed_in(request),
            pk,
            body.validated_data["user_id"],
            body.validated_data["channel"],
            context=audit_context(request),
        )
        return Response(delivery_out(delivery, admin=True), status=202)


class AskIn(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, max_length=1000)


class AskOut(serializers.Serializer):
    deliveries = serializers.ListField(child=serializers.IntegerField())


class AskConfirmationView(PersonView):
    @extend_schema(
        tags=["notifications"],
        summary="Ask the managers to confirm a pause (whoever may pause the job)",
        request=AskIn,
        responses={202: AskOut, **error_responses(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request, pk: int) -> Response:
        body = AskIn(data=request.data)
        body.is_valid(raise_exception=True)
        ids = ask_for_confirmation(
            signed_in(request),
            pk,
            body.validated_data.get("note", ""),
            context=audit_context(request),
        )
        return Response({"deliveries": ids}, status=202)


class AlertDeliveriesView(PersonView):
    @extend_schema(
        tags=["notifications"],
        summary="Every delivery of the alert, oldest first (members)",
        responses={200: DeliveryOut(many=True), **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        alert = scoped_get(Alert.objects, request.user, pk, team_path="job__team_id", noun="alert")
        deliveries = alert.deliveries.select_related("recipient").order_by("id")
        admin = is_admin(request.user, alert.job.team_id)
        return Response([delivery_out(d, admin=admin) for d in deliveries])


class ReceiptView(APIView):
    """The SMS/phone provider's status callback (Twilio-style form, signed with the account's
    auth token in X-Twilio-Signature): a sent message or call becomes delivered or failed."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    parser_classes = [FormParser]

    @extend_schema(
        tags=["notifications"],
        summary="Provider delivery receipt (signed by the provider)",
        request=None,
        responses={204: None, 403: None},
    )
    def post(self, request: Request) -> Response:
        form = {key: request.POST.get(key, "") for key in request.POST}
        token = str(settings.NOTIFY_PROVIDER_AUTH_TOKEN)
        expected = provider_signature(receipt_url(), form, token)
        given = request.headers.get("X-Twilio-Signature", "")
        if not token or not hmac.compare_digest(expected, given):
            return Response({"detail": "Bad signature."}, status=403)
        provider_id = form.get("MessageSid") or form.get("CallSid") or ""
        state = form.get("MessageStatus") or form.get("CallStatus") or ""
        record_receipt(provider_id, state)
        return Response(status=204)


class ProviderReplyView(APIView):
    """An answer to a page posted by the SMS/phone provider, signed with the shared secret
    (docs/security.md "Answers to a page"); the person is the one the page was sent to."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    parser_classes = [FormParser]

    def proof(self, request: Request) -> str:
        body = request.body  # the raw bytes, read before the form is parsed
        return verify_provider_request(
            str(settings.NOTIFY_REPLY_SECRET),
            request.headers.get(TIMESTAMP_HEADER, ""),
            request.headers.get(SIGNATURE_HEADER, ""),
            request.get_full_path(),
            body,
        )

    @staticmethod
    def answered(alert: Alert) -> Response:
        return Response({"alert": alert.pk, "status": alert.status}, status=200)


class SmsReplyView(ProviderReplyView):
    @extend_schema(
        tags=["notifications"],
        summary='An SMS reply to a page ("1" or "1 CODE" acknowledges; signed by the provider)',
        request=None,
        responses={200: None, **error_responses(400, 403, 404, 409)},
    )
    def post(self, request: Request) -> Response:
        proof = self.proof(request)
        form = request.POST
        alert = acknowledge_by_sms(
            form.get("From", ""), form.get("Body", ""), proof, audit_context(request)
        )
        return self.answered(alert)


class PhoneReplyView(ProviderReplyView):
    @extend_schema(
        tags=["notifications"],
        summary="The key pressed during a page's call (1 acknowledges; signed by the provider)",
        request=None,
        responses={200: None, **error_responses(400, 403, 404, 409)},
    )
    def post(self, request: Request) -> Response:
        proof = self.proof(request)
        form = request.POST
        alert = acknowledge_by_keypress(
            form.get("To", ""),
            request.GET.get("code", ""),
            form.get("Digits", ""),
            proof,
            audit_context(request),
        )
        return self.answered(alert)
