"""A person's actions on a job: pause, resume, terminate, confirm a pause, mitigate, isolate.

Thin: validate the body, call the one service of the verb (``breakers.control.job_actions``),
answer. The
services scope (404), ask the authority (403 with its reason), check the state (409) and audit
every attempt; errors reach the one error format (docs/protocol.md "Errors") through
``console.api.errors``.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from breakers.control import job_actions as actions
from breakers.control.payload import command_payload
from breakers.models import Command, CommandKind
from console.api.person_auth import PersonView, audit_context, error_responses
from incidents.models import PauseConfirmation, PauseDecision

ERRORS = error_responses(400, 401, 403, 404, 409)


class JobActionIn(serializers.Serializer):
    reason = serializers.CharField(max_length=2000, help_text="Why: shown to the job and kept.")
    alert_id = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text="The alert this answers (its level is what the authority judges).",
    )


class PauseJobIn(JobActionIn):
    reason = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=2000,
        help_text="Optional: a pause is one click; the reason can be added afterwards "
        "(POST …/pause/reason).",
    )


class PauseReasonIn(serializers.Serializer):
    reason = serializers.CharField(max_length=2000, help_text="Why the job was paused.")


class MitigateIn(JobActionIn):
    kind = serializers.ChoiceField(choices=[CommandKind.LOWER_LR, CommandKind.PAUSE_DATA])
    params = serializers.DictField(
        required=False, help_text='lower_lr: {"factor": 0 < f < 1}; pause_data: {}.'
    )


class IsolateNodeIn(JobActionIn):
    node = serializers.CharField(max_length=200)


class ConfirmPauseIn(serializers.Serializer):
    decision = serializers.ChoiceField(choices=PauseDecision.choices)
    checkpoint = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=1000,
        help_text="roll_back only: the checkpoint to resume from, by its catalogue id or path "
        "(GET /api/v1/jobs/{id}/checkpoints); anything else is 400.",
    )
    skip_steps = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=2**62),
        required=False,
        max_length=1000,
        help_text="roll_back only: steps after the checkpoint whose batches the job drops "
        "(the poisoned batch).",
    )
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000)


class CommandOut(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.CharField()
    params = serializers.DictField()
    severity = serializers.CharField(allow_null=True)
    reason = serializers.CharField()
    issued_at = serializers.DateTimeField()
    status = serializers.CharField()


class IssuedOut(serializers.Serializer):
    command = CommandOut()


class ConfirmationOut(serializers.Serializer):
    id = serializers.IntegerField()
    job_id = serializers.IntegerField()
    pause_command_id = serializers.IntegerField()
    level = serializers.CharField(allow_null=True)
    decision = serializers.CharField()
    checkpoint = serializers.CharField()
    decided_by = serializers.CharField()
    decided_at = serializers.DateTimeField()
    command = CommandOut(allow_null=True)


def command_out(command: Command) -> dict[str, Any]:
    return {**command_payload(command), "status": command.status}


def _issued(command: Command) -> Response:
    # 202: stored and on its way; the job's acknowledgement comes later (GET the job).
    return Response({"command": command_out(command)}, status=202)


def _body(serializer_class: type[serializers.Serializer], request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _schema(summary: str, request: type[serializers.Serializer]) -> Any:
    return extend_schema(
        tags=["actions"],
        summary=summary,
        request=request,
        responses={202: IssuedOut, **ERRORS},
    )


class PauseJobView(PersonView):
    @_schema("Checkpoint and pause the job (one click; on-call and above)", PauseJobIn)
    def post(self, request: Request, pk: int) -> Response:
        body = _body(PauseJobIn, request)
        return _issued(
            actions.pause_job(
                request.user,
                pk,
                reason=body.get("reason", ""),
                alert_id=body.get("alert_id"),
                context=audit_context(request),
            )
        )


class PauseReasonView(PersonView):
    @extend_schema(
        tags=["actions"],
        summary="Give the reason of the job's latest pause after the click (on-call and above)",
        description="Kept in the audit trail and on the incident's timeline; the pause command "
        "already sent is not changed. 409 when the job was never paused.",
        request=PauseReasonIn,
        responses={200: IssuedOut, **ERRORS},
    )
    def post(self, request: Request, pk: int) -> Response:
        body = _body(PauseReasonIn, request)
        pause = actions.add_pause_reason(
            request.user, pk, reason=body["reason"], context=audit_context(request)
        )
        return Response({"command": command_out(pause)})


class ResumeJobView(PersonView):
    @_schema("Resume a paused job (manager and above)", JobActionIn)
    def post(self, request: Request, pk: int) -> Response:
        body = _body(JobActionIn, request)
        return _issued(
            actions.resume_job(
                request.user,
                pk,
                reason=body["reason"],
                alert_id=body.get("alert_id"),
                context=audit_context(request),
            )
        )


class TerminateJobView(PersonView):
    @_schema("Terminate the job (manager and above)", JobActionIn)
    def post(self, request: Request, pk: int) -> Response:
        body = _body(JobActionIn, request)
        return _issued(
            actions.terminate_job(
                request.user,
                pk,
                reason=body["reason"],
                alert_id=body.get("alert_id"),
                context=audit_context(request),
            )
        )


class MitigateJobView(PersonView):
    @_schema("Apply a soft mitigation directly: lower_lr or pause_data (manager)", MitigateIn)
    def post(self, request: Request, pk: int) -> Response:
        body = _body(MitigateIn, request)
        return _issued(
            actions.apply_mitigation(
                request.user,
                pk,
                kind=body["kind"],
                params=body.get("params") or {},
                reason=body["reason"],
                alert_id=body.get("alert_id"),
                context=audit_context(request),
            )
        )


class IsolateNodeView(PersonView):
    @_schema("Isolate one node of the job (manager and above)", IsolateNodeIn)
    def post(self, request: Request, pk: int) -> Response:
        body = _body(IsolateNodeIn, request)
        return _issued(
            actions.isolate_node(
                request.user,
                pk,
                node=body["node"],
                reason=body["reason"],
                alert_id=body.get("alert_id"),
                context=audit_context(request),
            )
        )


class ConfirmPauseView(PersonView):
    @extend_schema(
        tags=["actions"],
        summary="Confirm the job's pause: keep paused, resume, or roll back to a checkpoint",
        description="On-call may confirm the system's automatic L3 pause; any other pause is "
        "ended by a manager. Once per pause: a second confirmation is 409, unless the job "
        "refused the first one's resume (then it replaces it).",
        request=ConfirmPauseIn,
        responses={200: ConfirmationOut, **ERRORS},
    )
    def post(self, request: Request, pk: int) -> Response:
        body = _body(ConfirmPauseIn, request)
        confirmation = actions.confirm_pause(
            request.user,
            pk,
            decision=body["decision"],
            checkpoint=body.get("checkpoint", ""),
            skip_steps=body.get("skip_steps"),
            reason=body.get("reason", ""),
            context=audit_context(request),
        )
        return Response(confirmation_out(confirmation))


def confirmation_out(confirmation: PauseConfirmation) -> dict[str, Any]:
    command = (
        Command.objects.filter(pk=confirmation.command_id).first()
        if confirmation.command_id is not None
        else None
    )
    return {
        "id": confirmation.pk,
        "job_id": confirmation.job_id,
        "pause_command_id": confirmation.pause_command_id,
        "level": confirmation.level or None,
        "decision": confirmation.decision,
        "checkpoint": confirmation.checkpoint,
        "decided_by": confirmation.decided_by.get_username(),
        "decided_at": confirmation.decided_at.isoformat(),
        "command": command_out(command) if command is not None else None,
    }
