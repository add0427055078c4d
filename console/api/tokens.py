"""My personal API tokens: list, create (shown once), revoke."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.person_auth import (
    PersonalTokenAuthentication,
    PersonView,
    audit_context,
    error_responses,
    signed_in,
)
from core.errors import Forbidden
from incidents.models import PersonalToken
from incidents.teams.tokens import issue_personal_token, revoke_personal_token


class TokenIn(serializers.Serializer):
    name = serializers.CharField(max_length=100, help_text="What the token is for.")


class TokenOut(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    prefix = serializers.CharField(help_text="The first characters, to recognise it.")
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)


class IssuedTokenOut(TokenOut):
    token = serializers.CharField(help_text="Shown this once; stored only hashed.")


def token_out(token: PersonalToken) -> dict[str, Any]:
    def when(value: Any) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "id": token.pk,
        "name": token.name,
        "prefix": token.prefix,
        "created_at": when(token.created_at),
        "last_used_at": when(token.last_used_at),
        "revoked_at": when(token.revoked_at),
    }


class TokenListView(PersonView):
    @extend_schema(
        tags=["tokens"],
        summary="My personal API tokens",
        responses={200: TokenOut(many=True), **error_responses(401)},
    )
    def get(self, request: Request) -> Response:
        tokens = PersonalToken.objects.filter(user=signed_in(request)).order_by(
            "-created_at", "-id"
        )
        return Response([token_out(t) for t in tokens])

    @extend_schema(
        tags=["tokens"],
        summary="Create a personal API token (from a browser session; shown once)",
        description="Send it as `Authorization: Token <token>`. Tokens act with your roles.",
        request=TokenIn,
        responses={201: IssuedTokenOut, **error_responses(400, 401, 403)},
    )
    def post(self, request: Request) -> Response:
        # Only from a logged-in browser session (or `manage.py create_token`): a leaked token
        # must not be able to mint successors that outlive its revocation.
        if isinstance(request.successful_authenticator, PersonalTokenAuthentication):
            raise Forbidden("Tokens are created from a logged-in session, not with a token.")
        body = TokenIn(data=request.data)
        body.is_valid(raise_exception=True)
        issued = issue_personal_token(
            signed_in(request), body.validated_data["name"], context=audit_context(request)
        )
        return Response({**token_out(issued.token), "token": issued.raw}, status=201)


class TokenRevokeView(PersonView):
    @extend_schema(
        tags=["tokens"],
        summary="Revoke one of my tokens (twice is harmless)",
        responses={200: TokenOut, **error_responses(401, 404)},
    )
    def delete(self, request: Request, pk: int) -> Response:
        token = revoke_personal_token(signed_in(request), pk, context=audit_context(request))
        return Response(token_out(token))
