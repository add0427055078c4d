"""``POST /api/v1/agent/snapshots``: the agent's environment snapshots (docs/protocol.md
"Environment snapshots"). Validation and storage are ``breakers.snapshots.intake``; this is only the
HTTP shape."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from breakers.snapshots import intake as snapshots
from breakers.snapshots import queries
from console.api.agent import ERRORS, AgentView, declares_more_than
from console.api.agent_auth import agent_job
from console.api.person_auth import PersonView
from console.api.series import scoped_job
from core.errors import NotFound, PayloadTooLarge


class SnapshotCheckpointDoc(serializers.Serializer):
    path = serializers.CharField(max_length=snapshots.MAX_PATH_LENGTH)
    sha256 = serializers.RegexField(r"^[0-9a-f]{64}$")
    bytes = serializers.IntegerField(required=False, min_value=0)


class SnapshotUploadDoc(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["start", "checkpoint", "resume"])
    step = serializers.IntegerField(min_value=0)
    snapshot = serializers.DictField(
        help_text="The environment: packages, python, platform, environment (secrets "
        "redacted as '<redacted>'; a value in clear under a name with TOKEN, SECRET, PASSWORD "
        "or KEY is refused with 400 unredacted_secret), seeds, git, image, scheduler, "
        "resources, data_position, taken_at (ISO 8601). At most 1 MiB (413 above)."
    )
    checkpoint = SnapshotCheckpointDoc(
        required=False,
        help_text="Required with kind=checkpoint (the checkpoint written) and kind=resume (the "
        "checkpoint resumed from), refused with kind=start.",
    )


class SnapshotStoredDoc(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.CharField()
    step = serializers.IntegerField()
    created = serializers.BooleanField(help_text="False: this snapshot had been stored before.")


class SnapshotView(AgentView):
    @extend_schema(
        operation_id="agent_snapshot",
        request=SnapshotUploadDoc,
        responses={
            201: SnapshotStoredDoc,
            200: OpenApiResponse(SnapshotStoredDoc, description="Sent before: the same row."),
            **ERRORS,
        },
        tags=["agent"],
        summary="Store an environment snapshot (at start, at each checkpoint, after a resume)",
    )
    def post(self, request: Request) -> Response:
        job = agent_job(request)
        snapshot, created = snapshots.record_snapshot(job.pk, self.raw_body(request))
        body = {"id": snapshot.pk, "kind": snapshot.kind, "step": snapshot.step, "created": created}
        return Response(body, status=201 if created else 200)

    def raw_body(self, request: Request) -> bytes:
        # The snapshot limit is far below the metrics one: refuse before reading the body.
        limit = snapshots.MAX_SNAPSHOT_BYTES
        if declares_more_than(request, limit):
            declared = request.META.get("CONTENT_LENGTH", "")
            said = declared if len(declared) <= 20 else f"{declared[:20]}…"
            raise PayloadTooLarge(
                f"A snapshot holds at most {limit} bytes; this one has {said}.",
                fields={"snapshot": f"at most {limit} bytes"},
            )
        return super().raw_body(request)


# -- people: a job's snapshots, the diff between two, the readiness grade ---------------------


class JobSnapshotListView(PersonView):
    @extend_schema(
        tags=["snapshots"],
        summary="A job's environment snapshots (at start, at each checkpoint, after resumes)",
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request: Request, pk: int) -> Response:
        job = scoped_job(request, pk)
        rows = [queries.summary(row) for row in queries.job_snapshots(job.pk)]
        return Response({"job_id": job.pk, "snapshots": rows})


class JobSnapshotDiffView(PersonView):
    @extend_schema(
        tags=["snapshots"],
        summary="The difference between two snapshots of a job, grouped",
        description="`a` and `b` name two snapshots of the job. Without them: the latest "
        "resume against its checkpoint's snapshot (`diff=resume`, the default), else the two "
        "latest snapshots (`diff=latest`). 404 when the job has fewer than two snapshots.",
        parameters=[
            OpenApiParameter("a", OpenApiTypes.INT, required=False),
            OpenApiParameter("b", OpenApiTypes.INT, required=False),
            OpenApiParameter("diff", OpenApiTypes.STR, enum=["resume", "latest"], required=False),
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request: Request, pk: int) -> Response:
        job = scoped_job(request, pk)
        params = request.query_params
        chosen = queries.choose_diff(
            job.pk, params.get("a", ""), params.get("b", ""), params.get("diff", "")
        )
        if chosen is None:
            raise NotFound("This job has fewer than two snapshots: nothing to compare yet.")
        return Response({"job_id": job.pk, **chosen.as_dict()})


class JobReadinessView(PersonView):
    @extend_schema(
        tags=["snapshots"],
        summary="The job's sandbox readiness, graded from its latest snapshot",
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request: Request, pk: int) -> Response:
        job = scoped_job(request, pk)
        return Response({"job_id": job.pk, **queries.job_readiness(job.pk).as_dict()})
