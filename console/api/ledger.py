"""The goodput ledger over REST: a team's (or one job's) accelerator-hours, what each incident
cost and the effective training time ratio, as JSON or CSV (``breakers.ledger``)."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from breakers.ledger import goodput_ledger
from console.api.params import id_param
from console.api.person_auth import PersonView, error_responses
from console.api.reviews import report_period
from core.errors import InvalidInput
from incidents.reviews.ledger_export import ledger_csv

PARAMETERS = ("since", "until", "job")
_PARAMETER_DOCS = [
    OpenApiParameter("since", OpenApiTypes.STR, description="default: 30 days before until"),
    OpenApiParameter("until", OpenApiTypes.STR, description="default: now"),
    OpenApiParameter("job", OpenApiTypes.INT, description="one job of the team"),
]


def ledger_of(request: Request, pk: int) -> tuple[dict[str, Any], str]:
    """The ledger the query asks for (400 naming any parameter it does not take, or gives
    twice), and the name its download takes."""
    for name in request.query_params:
        if name not in PARAMETERS:
            raise InvalidInput(f"Unknown parameter {name[:60]!r}.", fields={name[:60]: "unknown"})
        if len(request.query_params.getlist(name)) > 1:
            raise InvalidInput(f"{name} is given twice.", fields={name: "give it once"})
    since, until = report_period(
        request.query_params.get("since"), request.query_params.get("until")
    )
    job = id_param(request, "job", what="a job id")
    name = f"goodput-team-{pk}" + (f"-job-{job}" if job else "")
    return goodput_ledger(request.user, pk, since, until, job), name


class GoodputLedgerView(PersonView):
    @extend_schema(
        tags=["reviews"],
        summary="The goodput ledger: accelerator-hours, the cost of each incident, ETTR",
        parameters=_PARAMETER_DOCS,
        responses={200: OpenApiTypes.OBJECT, **error_responses(400, 401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        return Response(ledger_of(request, pk)[0])


class GoodputLedgerCsvView(PersonView):
    @extend_schema(
        tags=["reviews"],
        summary="The goodput ledger as CSV: a row per period, week, job and incident",
        parameters=_PARAMETER_DOCS,
        responses={
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR),
            **error_responses(400, 401, 404),
        },
    )
    def get(self, request: Request, pk: int) -> HttpResponse:
        document, name = ledger_of(request, pk)
        response = HttpResponse(ledger_csv(document), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{name}.csv"'
        return response
