"""A team's rule set: the rules in force, their versions with diffs, and changes (admins).

Reading is for the team's members; changing is ``edit_rules`` (admins), through
``breakers.detection.rulesets.change_rules`` — the same verb the settings page calls.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from breakers.detection import ruleset_core, rulesets
from breakers.models import RuleSetVersion
from console.api.params import int_param
from console.api.person_auth import PersonView, audit_context, error_responses, signed_in
from core.errors import InvalidInput, NotFound
from incidents.models import Team
from incidents.teams.access import scoped_get


class ChangeDoc(serializers.Serializer):
    op = serializers.ChoiceField(choices=list(ruleset_core.OPS))
    key = serializers.CharField(help_text="The rule's key (lower-case letters, digits, - and _).")
    # A declared field named like a Serializer attribute: DRF's metaclass moves it into the
    # serializer's fields; the stubs see a class attribute overriding the base's.
    fields = serializers.DictField(  # type: ignore[assignment]
        required=False,
        help_text="create/update: the rule's fields (name, layer, metric, detector, params, "
        "severity, action, action_params, per_node, per_metric, enabled, clear_after, "
        "clear_after_seconds, runbook, recovery, recovery_budget, shadow); params and "
        "action_params are replaced as a whole. recovery: hold (a person decides after the "
        "rule's automatic L3 pause) or recover (docs/recovery.md); shadow: observe only "
        "(docs/rules.md).",
    )


class ChangesIn(serializers.Serializer):
    why = serializers.CharField(help_text="Why the rules change; kept with the version.")
    changes = ChangeDoc(many=True, help_text="Applied together, all or nothing.")


class VersionOut(serializers.Serializer):
    number = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    actor = serializers.CharField(allow_null=True, help_text="null: recorded by the system.")
    why = serializers.CharField()
    summary = serializers.CharField()
    diff = serializers.ListField(child=serializers.DictField())
    changes = serializers.ListField(child=serializers.CharField(), help_text="The diff, readable.")
    fingerprint = serializers.CharField()


class VersionDetailOut(VersionOut):
    snapshot = serializers.DictField(help_text="The whole rule set of this version.")


class DrillOut(serializers.Serializer):
    drilled = serializers.BooleanField()
    since = serializers.CharField(help_text="The version's change: 'not drilled since' it.")
    missing_scenarios = serializers.ListField(child=serializers.CharField())
    uncovered_rules = serializers.ListField(child=serializers.CharField())
    url = serializers.CharField(help_text="Where to run the missing drills.")


class RuleSetOut(serializers.Serializer):
    team_id = serializers.IntegerField()
    version = VersionDetailOut()
    drill = DrillOut()


def version_out(version: RuleSetVersion, *, snapshot: bool = False) -> dict[str, Any]:
    body = {
        "number": version.number,
        "created_at": version.created_at.isoformat(),
        "actor": version.actor.get_username() if version.actor else None,
        "why": version.why,
        "summary": version.summary,
        "diff": version.diff,
        "changes": rulesets.describe_lines(version),
        "fingerprint": version.fingerprint,
    }
    if snapshot:
        body["snapshot"] = version.snapshot
    return body


def drill_out(badge: rulesets.DrillBadge) -> dict[str, Any]:
    return {
        "drilled": badge.drilled,
        "since": badge.since,
        "missing_scenarios": badge.missing_scenarios,
        "uncovered_rules": badge.uncovered_rules,
        "url": badge.url,
    }


def _team(request: Request, pk: int) -> Team:
    return scoped_get(Team.objects, request.user, pk, team_path="id", noun="team")


def _ruleset(team: Team) -> dict[str, Any]:
    badge = rulesets.drill_badge(team)
    version = RuleSetVersion.objects.select_related("actor").get(team=team, number=badge.version)
    return {
        "team_id": team.pk,
        "version": version_out(version, snapshot=True),
        "drill": drill_out(badge),
    }


class RuleSetView(PersonView):
    @extend_schema(
        tags=["rules"],
        summary="The team's rule set in force: its version, every rule, drilled or not (members)",
        responses={200: RuleSetOut, **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        return Response(_ruleset(_team(request, pk)))

    @extend_schema(
        tags=["rules"],
        summary="Change the team's rules: create, update, enable, disable, delete (admins)",
        request=ChangesIn,
        responses={201: RuleSetOut, **error_responses(400, 401, 403, 404)},
    )
    def post(self, request: Request, pk: int) -> Response:
        try:
            team = _team(request, pk)  # another team's id is a 404 whatever the body
        except NotFound:
            # The service audits the refused probe for the owning team (who knocked), then
            # answers the same 404; the body is never looked at.
            rulesets.change_rules(
                signed_in(request), pk, None, None, context=audit_context(request)
            )
            raise
        data = request.data if isinstance(request.data, dict) else None
        if data is None:
            raise InvalidInput("The body is an object {why, changes}.", fields={"body": "object"})
        unknown = set(data) - {"why", "changes"}
        if unknown:
            name = sorted(map(str, unknown))[0]
            raise InvalidInput(f"Unknown field {name!r}.", fields={name: "unknown field"})
        rulesets.change_rules(
            signed_in(request),
            team.pk,
            data.get("why"),
            data.get("changes"),
            context=audit_context(request),
        )
        return Response(_ruleset(team), status=201)


class VersionListView(PersonView):
    @extend_schema(
        tags=["rules"],
        summary="The team's rule set versions, newest first, with their diffs (members)",
        parameters=[OpenApiParameter("limit", int, description="At most this many (≤ 200).")],
        responses={200: VersionOut(many=True), **error_responses(400, 401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        team = _team(request, pk)
        limit = int_param(request, "limit", minimum=1, maximum=200, default=50)
        rulesets.current_version(team)
        versions = team.ruleset_versions.select_related("actor").order_by("-number")[:limit]
        return Response([version_out(v) for v in versions])


class VersionView(PersonView):
    @extend_schema(
        tags=["rules"],
        summary="One version of the team's rule set, with its whole snapshot (members)",
        responses={200: VersionDetailOut, **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int, number: int) -> Response:
        team = _team(request, pk)
        version = team.ruleset_versions.select_related("actor").filter(number=number).first()
        if version is None:
            raise NotFound(f"Team {team.name} has no rule set version {number}.")
        return Response(version_out(version, snapshot=True))
