"""Chart data of a job: downsampled metric history and the alert/command markers.

GET /api/v1/jobs/<id>/series?names=loss,grad_norm&from_step=&to_step=&max_points=2000
    &rank=0&ranks=1,2&spread=1
GET /api/v1/jobs/<id>/markers

Team-scoped like every job endpoint (another team's job is a 404). The client asks for the
whole run first, again with the zoomed step range when a person zooms in (finer buckets), and
with ``from_step`` = its last step + 1 when the websocket says points were appended.
"""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from breakers import metrics as history
from breakers.agent.protocol import MAX_RANK
from console.api.jobs import visible_jobs
from console.api.params import int_param, parse_int
from console.api.person_auth import PersonView
from core.errors import InvalidInput
from incidents.models import Job

BAND_METRIC = "loss"
# A range to read, not a step to store: any bigint bounds it (no arithmetic is done on it).
MAX_QUERY_STEP = 2**63 - 1


def _step_param(request: Request, name: str) -> int | None:
    return int_param(
        request, name, minimum=0, maximum=MAX_QUERY_STEP, blank_is_absent=True, what="a step"
    )


def _names(request: Request) -> list[str]:
    names = [n.strip() for n in request.query_params.get("names", "").split(",") if n.strip()]
    if not names or len(names) > history.MAX_NAMES:
        raise InvalidInput(
            "Name the metrics.",
            fields={"names": f"1 to {history.MAX_NAMES} metric names, comma-separated"},
        )
    return list(dict.fromkeys(names))


def _max_points(request: Request) -> int:
    """How many buckets at most (default 2000)."""
    return int_param(
        request,
        "max_points",
        minimum=2,
        maximum=history.MAX_POINTS_LIMIT,
        default=2000,
        blank_is_absent=True,
    )


def _ranks(request: Request) -> tuple[int, ...]:
    raw = request.query_params.get("ranks", "")
    parts = [part.strip() for part in raw.split(",") if part.strip()]
    problem = (
        f"up to {history.MAX_RANKS} ranks (whole numbers from 0 to {MAX_RANK}), comma-separated"
    )
    if len(parts) > history.MAX_RANKS:
        raise InvalidInput("Bad ranks.", fields={"ranks": problem})
    try:
        ranks = [parse_int(p, "ranks", minimum=0, maximum=MAX_RANK) for p in parts]
    except InvalidInput:
        raise InvalidInput("Bad ranks.", fields={"ranks": problem}) from None
    return tuple(dict.fromkeys(ranks))


def _spread(request: Request, job: Job) -> bool:
    """Asked for (``spread=1``/``0``), else whenever the job runs more than one rank."""
    raw = request.query_params.get("spread", "")
    if raw not in ("", "0", "1"):
        raise InvalidInput("Bad spread.", fields={"spread": "0 or 1"})
    if raw:
        return raw == "1"
    return (job.world_size or 0) > 1 or job.ranks.filter(rank__gt=0).exists()


def scoped_job(request: Request, pk: int) -> Job:
    return get_object_or_404(visible_jobs(request.user), pk=pk)


SeriesOut = inline_serializer(
    "MetricSeries",
    {
        "job_id": serializers.IntegerField(),
        "from_step": serializers.IntegerField(allow_null=True),
        "to_step": serializers.IntegerField(allow_null=True),
        "max_points": serializers.IntegerField(),
        "series": serializers.DictField(
            help_text="name → {rank, bucket_steps, steps[], times[] (epoch s), values[] "
            '(numbers, or "NaN"/"Infinity"/"-Infinity"), band: {rule, k, window, lower[], '
            "upper[]} | null, source: raw | rollups-10s | rollups-60s, spread: {steps[], "
            "low[], high[], marker_steps[], marker_values[]} | null (min/max across ranks), "
            "ranks: {rank: {steps[], times[], values[]}}}"
        ),
        "world_size": serializers.IntegerField(allow_null=True),
    },
)


class SeriesView(PersonView):
    # A browser session or a personal token, like every person-facing endpoint.

    @extend_schema(
        tags=["charts"],
        summary="Metric history of a job, min/max-downsampled per step bucket",
        description="Each bucket of whole steps keeps its finite min and max at their steps, "
        "plus its first NaN/+Inf/-Inf. `band` (loss only): the loss-deviation rule's mean ± kσ "
        "of the preceding window, aligned with the points (null in warm-up).",
        parameters=[
            OpenApiParameter("names", OpenApiTypes.STR, required=True),
            OpenApiParameter("from_step", OpenApiTypes.INT),
            OpenApiParameter("to_step", OpenApiTypes.INT),
            OpenApiParameter(
                "max_points",
                {"type": "integer", "minimum": 2, "maximum": history.MAX_POINTS_LIMIT},
                description="How many buckets at most (default 2000).",
            ),
            OpenApiParameter(
                "rank", OpenApiTypes.INT, description="Whose line (default 0; with the band)."
            ),
            OpenApiParameter(
                "ranks", OpenApiTypes.STR, description="More ranks' lines, comma-separated."
            ),
            OpenApiParameter(
                "spread",
                {"type": "integer", "enum": [0, 1]},
                description="Min/max across every rank (default: when the job has ranks).",
            ),
        ],
        responses={200: SeriesOut},
    )
    def get(self, request: Request, pk: int) -> Response:
        job = scoped_job(request, pk)
        names = _names(request)
        from_step = _step_param(request, "from_step")
        to_step = _step_param(request, "to_step")
        max_points = _max_points(request)
        rank = int_param(
            request, "rank", minimum=0, maximum=MAX_RANK, default=0, blank_is_absent=True
        )
        ranks, spread = _ranks(request), _spread(request, job)
        rule = history.band_rule(job.team_id, BAND_METRIC) if BAND_METRIC in names else None
        data = {
            name: history.series(
                job,
                name,
                from_step=from_step,
                to_step=to_step,
                max_points=max_points,
                rule=rule if name == BAND_METRIC else None,
                rank=rank,
                ranks=ranks,
                spread=spread,
            )
            for name in names
        }
        return Response(
            {
                "job_id": job.pk,
                "from_step": from_step,
                "to_step": to_step,
                "max_points": max_points,
                "world_size": job.world_size,
                "series": data,
            }
        )


class MarkersView(PersonView):
    @extend_schema(
        tags=["charts"],
        summary="Where the job's alerts fired and its commands acted (chart markers)",
        responses={
            200: inline_serializer(
                "ChartMarkers",
                {
                    "alerts": serializers.ListField(child=serializers.DictField()),
                    "commands": serializers.ListField(child=serializers.DictField()),
                },
            )
        },
    )
    def get(self, request: Request, pk: int) -> Response:
        return Response(history.markers(scoped_job(request, pk)))
