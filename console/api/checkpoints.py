"""The checkpoint catalogue over HTTP: the agent reports each checkpoint it writes
(``POST /api/v1/agent/checkpoints``), people read a job's catalogue (``GET
/api/v1/jobs/{id}/checkpoints``). Parsing, storing and judging are ``breakers.checkpoints``."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from breakers import checkpoints as catalogue
from console.api.agent import ERRORS, AgentView
from console.api.agent_auth import agent_job
from console.api.person_auth import PersonView
from console.api.series import scoped_job


class CheckpointReportDoc(serializers.Serializer):
    path = serializers.CharField(max_length=catalogue.MAX_PATH_LENGTH)
    sha256 = serializers.RegexField(r"^[0-9a-f]{64}$")
    step = serializers.IntegerField(min_value=0)
    bytes = serializers.IntegerField(required=False, min_value=0, allow_null=True)
    rank = serializers.IntegerField(required=False, min_value=0)
    reason = serializers.ChoiceField(choices=["brake", "manual", "framework"], required=False)
    weights_step = serializers.IntegerField(
        required=False,
        min_value=0,
        allow_null=True,
        help_text="The last step whose optimizer update the weights hold (the step guard).",
    )
    set = serializers.DictField(
        required=False,
        allow_null=True,
        help_text="Multi-rank jobs: the checkpoint set (manifest, manifest_sha256, world_size, "
        "shards: every rank's rank, path, bytes, sha256); refused naming a missing rank.",
    )


class CheckpointOut(serializers.Serializer):
    id = serializers.IntegerField()
    path = serializers.CharField()
    sha256 = serializers.CharField()
    step = serializers.IntegerField()
    weights_step = serializers.IntegerField(allow_null=True)
    rank = serializers.IntegerField()
    bytes = serializers.IntegerField(allow_null=True)
    reason = serializers.CharField()
    reported_at = serializers.DateTimeField()
    clean = serializers.BooleanField(
        help_text="No optimizer update from the latest incident's first anomalous step on."
    )
    preselected = serializers.BooleanField(help_text="The last clean one: a roll back's default.")
    set = serializers.DictField(
        allow_null=True, help_text="The complete checkpoint set it stands for (multi-rank jobs)."
    )


class AgentCheckpointView(AgentView):
    @extend_schema(
        operation_id="agent_checkpoint",
        request=CheckpointReportDoc,
        responses={
            201: CheckpointOut,
            200: OpenApiResponse(CheckpointOut, description="Reported before: the same row."),
            **ERRORS,
        },
        tags=["agent"],
        summary="Add a checkpoint the job wrote to its catalogue",
    )
    def post(self, request: Request) -> Response:
        job = agent_job(request)
        report = catalogue.parse_report_body(self.raw_body(request))
        row, created = catalogue.record_checkpoint(job.pk, report)
        body = catalogue.checkpoint_out(row, catalogue.lineage(job.pk))
        return Response(body, status=201 if created else 200)


class JobCheckpointsView(PersonView):
    @extend_schema(
        tags=["jobs"],
        summary="The job's checkpoint catalogue, newest first, clean or after the anomaly",
        responses={200: CheckpointOut(many=True)},
    )
    def get(self, request: Request, pk: int) -> Response:
        job = scoped_job(request, pk)
        return Response(catalogue.catalogue(job.pk))
