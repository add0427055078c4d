"""Fire drills over the API: start a drill set (admins), read scorecards (members)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from breakers.drills import runs, workloads
from breakers.drills.scenarios import SCENARIOS
from breakers.models import DrillRun, DrillWorkload
from console.api.person_auth import PersonView, audit_context, error_responses, signed_in
from incidents.models import Team
from incidents.teams.access import scoped_get


class DrillIn(serializers.Serializer):
    scenarios = serializers.ListField(
        child=serializers.CharField(max_length=64),
        min_length=1,
        max_length=len(SCENARIOS) + 2,
        help_text=f"Scenario names, or ['all'] (the full drill set): {', '.join(SCENARIOS)}.",
    )
    executor = serializers.ChoiceField(choices=list(runs.EXECUTORS), default="local")
    workload = serializers.ChoiceField(
        choices=list(runs.WORKLOADS),
        default="builtin",
        help_text="builtin (the built-in PyTorch workload) or team (the team's own command).",
    )


class WorkloadIn(serializers.Serializer):
    command = serializers.CharField(
        allow_blank=True,
        max_length=workloads.MAX_COMMAND_LENGTH,
        trim_whitespace=True,
        help_text="The training command line (absolute program path first; never run by a "
        "shell). Empty: back to the built-in workload.",
    )
    verify_command = serializers.CharField(
        allow_blank=True,
        required=False,
        default="",
        max_length=workloads.MAX_COMMAND_LENGTH,
        help_text='Reads {"path", "sha256"} on stdin, restores, runs one step, prints '
        '{"loads": true, ...}.',
    )


class WorkloadOut(serializers.Serializer):
    enabled = serializers.BooleanField(help_text="The operator allows teams' own commands.")
    command = serializers.CharField(help_text="Empty: the built-in workload.")
    verify_command = serializers.CharField()
    updated_by = serializers.CharField(allow_null=True)
    updated_at = serializers.DateTimeField(allow_null=True)


def workload_out(team: Team) -> dict[str, Any]:
    own = DrillWorkload.objects.filter(team=team).select_related("updated_by").first()
    return {
        "enabled": workloads.team_commands_enabled(),
        "command": own.command if own else "",
        "verify_command": own.verify_command if own else "",
        "updated_by": own.updated_by.get_username() if own and own.updated_by else None,
        "updated_at": own.updated_at.isoformat() if own else None,
    }


class DrillCheckOut(serializers.Serializer):
    name = serializers.CharField()
    passed = serializers.BooleanField()
    measured = serializers.CharField()
    expectation = serializers.CharField()
    detail = serializers.CharField()


class DrillRunOut(serializers.Serializer):
    id = serializers.IntegerField()
    team_id = serializers.IntegerField()
    scenario = serializers.CharField()
    status = serializers.CharField()
    drill_set = serializers.UUIDField()
    job_id = serializers.IntegerField(allow_null=True)
    executor = serializers.CharField()
    command = serializers.CharField(help_text="The team's own command; empty: the built-in one.")
    ruleset_version = serializers.IntegerField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    fault_step = serializers.IntegerField(allow_null=True)
    detect_seconds = serializers.FloatField(allow_null=True)
    brake_seconds = serializers.FloatField(allow_null=True)
    brake_steps = serializers.IntegerField(allow_null=True)
    error = serializers.CharField()
    checks = DrillCheckOut(many=True)


def drill_out(run: DrillRun) -> dict[str, Any]:
    return {
        "id": run.pk,
        "team_id": run.team_id,
        "scenario": run.scenario,
        "status": run.status,
        "drill_set": str(run.drill_set),
        "job_id": run.job_id,
        "executor": run.executor,
        "command": run.command,
        "ruleset_version": run.ruleset_version,
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "fault_step": run.fault_step,
        "detect_seconds": run.detect_seconds,
        "brake_seconds": run.brake_seconds,
        "brake_steps": run.brake_steps,
        "error": run.error,
        "checks": [
            {
                "name": c.name,
                "passed": c.passed,
                "measured": c.measured,
                "expectation": c.expectation,
                "detail": c.detail,
            }
            for c in run.checks.all()
        ],
    }


class TeamDrillsView(PersonView):
    @extend_schema(
        tags=["drills"],
        summary="The team's drills, newest first (members)",
        responses={200: DrillRunOut(many=True), **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        team = scoped_get(Team.objects, request.user, pk, team_path="pk", noun="team")
        found = DrillRun.objects.filter(team=team).prefetch_related("checks").order_by("-pk")
        return Response([drill_out(run) for run in found[:200]])

    @extend_schema(
        tags=["drills"],
        summary="Start a drill set on sandbox jobs (admin)",
        description="Each scenario runs on a sandbox job of its own, through the real stack; "
        "the set starts at once in the background. Poll the drills for their scorecards.",
        request=DrillIn,
        responses={202: DrillRunOut(many=True), **error_responses(400, 401, 403, 404)},
    )
    def post(self, request: Request, pk: int) -> Response:
        team = scoped_get(Team.objects, request.user, pk, team_path="pk", noun="team")
        body = DrillIn(data=request.data)
        body.is_valid(raise_exception=True)
        queued = runs.request_drills(
            team,
            body.validated_data["scenarios"],
            actor=request.user,
            executor=body.validated_data["executor"],
            workload=body.validated_data["workload"],
            context=audit_context(request),
        )
        return Response([drill_out(run) for run in queued], status=202)


class TeamWorkloadView(PersonView):
    @extend_schema(
        tags=["drills"],
        summary="The team's own drill workload, if any (members)",
        responses={200: WorkloadOut, **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        team = scoped_get(Team.objects, request.user, pk, team_path="pk", noun="team")
        return Response(workload_out(team))

    @extend_schema(
        tags=["drills"],
        summary="Set the team's own drill workload (admin, where the operator allows it)",
        request=WorkloadIn,
        responses={200: WorkloadOut, **error_responses(400, 401, 403, 404)},
    )
    def put(self, request: Request, pk: int) -> Response:
        body = WorkloadIn(data=request.data)
        body.is_valid(raise_exception=True)
        workloads.save_team_workload(
            signed_in(request), pk, dict(body.validated_data), context=audit_context(request)
        )
        team = scoped_get(Team.objects, request.user, pk, team_path="pk", noun="team")
        return Response(workload_out(team))


class DrillDetailView(PersonView):
    @extend_schema(
        tags=["drills"],
        summary="One drill and its scorecard (members)",
        responses={200: DrillRunOut, **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        run = scoped_get(DrillRun.objects, request.user, pk, team_path="team_id", noun="drill")
        return Response(drill_out(run))
