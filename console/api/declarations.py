"""What is a job's, declared by a team admin (docs/security.md "Declarations"): the HTTP shape
of ``breakers.declarations``.

- ``GET/PUT /api/v1/jobs/{id}/inference-servers``: the load balancer servers of an inference
  job, the only ones the traffic executor acts on for it;
- ``GET/PUT /api/v1/teams/{id}/checkpoint-root`` and ``/api/v1/jobs/{id}/checkpoint-root``:
  where the team's (or one job's) checkpoints must live;
- ``GET/PUT /api/v1/jobs/{id}/size``: what the job occupies, for a review's accelerator-hours
  (``incidents.job_size``; declared by a manager, else reported by the job).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from breakers import declarations
from breakers.executors.targets import declared_root
from breakers.models import CheckpointRoot
from console.api.person_auth import PersonView, audit_context, error_responses, signed_in
from incidents.job_size import declare_job_size_as, size_out
from incidents.models import Job, JobSize, Team
from incidents.teams.access import scoped_get

ServerDoc = inline_serializer(
    "InferenceServer",
    {
        "backend": serializers.RegexField(r"^[A-Za-z0-9_.:\-]{1,100}$"),
        "server": serializers.RegexField(r"^[A-Za-z0-9_.:\-]{1,100}$"),
    },
)
ServersDoc = inline_serializer(
    "InferenceServers", {"servers": serializers.ListField(child=ServerDoc, max_length=1000)}
)
SizeInDoc = inline_serializer(
    "JobSizeIn",
    {
        "nodes": serializers.IntegerField(min_value=1, max_value=100_000),
        "gpus_per_node": serializers.IntegerField(
            min_value=0, max_value=1024, help_text="Accelerators per node."
        ),
        "accelerator": serializers.CharField(
            max_length=100, required=False, allow_blank=True, help_text="e.g. H100 80GB"
        ),
    },
)
SizeOutDoc = inline_serializer(
    "JobSize",
    {
        "size": inline_serializer(
            "JobSizeOut",
            {
                "nodes": serializers.IntegerField(),
                "gpus_per_node": serializers.IntegerField(),
                "accelerator": serializers.CharField(),
                "accelerators": serializers.IntegerField(help_text="nodes × gpus_per_node"),
                "source": serializers.ChoiceField(choices=["declared", "reported"]),
            },
            allow_null=True,
            help_text="null: neither declared nor reported (accelerator-hours not measured).",
        )
    },
)
RootInDoc = inline_serializer(
    "CheckpointRootIn",
    {"root": serializers.CharField(max_length=1000, allow_blank=True, help_text="'' removes")},
)
RootOutDoc = inline_serializer(
    "CheckpointRootOut",
    {
        "root": serializers.CharField(help_text="Declared here ('' when none)."),
        "effective": serializers.CharField(
            help_text="What applies: the job's, else its team's, else the operator's default."
        ),
    },
)


def _job(request: Request, pk: int) -> Job:
    return scoped_get(Job.objects, request.user, pk, team_path="team_id", noun="job")


class InferenceServersView(PersonView):
    @extend_schema(
        tags=["jobs"],
        summary="The load balancer servers declared for an inference job (members)",
        responses={200: ServersDoc, **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        return Response(declarations.servers_out(_job(request, pk)))

    @extend_schema(
        tags=["jobs"],
        summary="Declare the job's load balancer servers (team admin); replaces the list",
        request=ServersDoc,
        responses={200: ServersDoc, **error_responses(400, 401, 403, 404, 409)},
    )
    def put(self, request: Request, pk: int) -> Response:
        declarations.declare_inference_servers(
            signed_in(request), pk, request.data, context=audit_context(request)
        )
        return Response(declarations.servers_out(_job(request, pk)))


def _root_out(team_id: int, job: Job | None) -> dict[str, Any]:
    rows = CheckpointRoot.objects.filter(team_id=team_id, job=job)
    root = rows.values_list("root", flat=True).first() or ""
    if job is not None:
        return {"root": root, "effective": declared_root(job.pk)}
    return {"root": root, "effective": root}


class TeamCheckpointRootView(PersonView):
    @extend_schema(
        tags=["teams"],
        summary="The team's checkpoint root (members)",
        responses={200: RootOutDoc, **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        team = scoped_get(Team.objects, request.user, pk, team_path="pk", noun="team")
        return Response(_root_out(team.pk, None))

    @extend_schema(
        tags=["teams"],
        summary="Declare the team's checkpoint root (team admin)",
        request=RootInDoc,
        responses={200: RootOutDoc, **error_responses(400, 401, 403, 404, 409)},
    )
    def put(self, request: Request, pk: int) -> Response:
        declarations.declare_checkpoint_root(
            signed_in(request), pk, request.data, context=audit_context(request)
        )
        return Response(_root_out(pk, None))


class JobCheckpointRootView(PersonView):
    @extend_schema(
        tags=["jobs"],
        summary="The job's checkpoint root, and the one in force (members)",
        responses={200: RootOutDoc, **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        job = _job(request, pk)
        return Response(_root_out(job.team_id, job))

    @extend_schema(
        tags=["jobs"],
        summary="Declare one job's own checkpoint root (team admin)",
        request=RootInDoc,
        responses={200: RootOutDoc, **error_responses(400, 401, 403, 404, 409)},
    )
    def put(self, request: Request, pk: int) -> Response:
        declarations.declare_checkpoint_root(
            signed_in(request), 0, request.data, job_id=pk, context=audit_context(request)
        )
        job = _job(request, pk)
        return Response(_root_out(job.team_id, job))


def _size_out(job: Job) -> dict[str, Any]:
    return {"size": size_out(JobSize.objects.filter(job=job).first())}


class JobSizeView(PersonView):
    @extend_schema(
        tags=["jobs"],
        summary="What the job occupies, declared or reported (members)",
        responses={200: SizeOutDoc, **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        return Response(_size_out(_job(request, pk)))

    @extend_schema(
        tags=["jobs"],
        summary="Declare what the job occupies (manager); replaces a reported size",
        request=SizeInDoc,
        responses={200: SizeOutDoc, **error_responses(400, 401, 403, 404)},
    )
    def put(self, request: Request, pk: int) -> Response:
        declare_job_size_as(request.user, pk, request.data, context=audit_context(request))
        return Response(_size_out(_job(request, pk)))
