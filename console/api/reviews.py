"""Post-incident reviews over REST: read and edit the write-up, export it (Markdown, JSON), and
a team's incident report.

Authentication is every person endpoint's (``PersonView``): a browser session, with DRF's CSRF
check on PUT, or a personal token; nobody logged in is a 401.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.params import parse_moment
from console.api.person_auth import PersonView, audit_context, signed_in
from console.api.person_auth import error_responses as person_errors
from core.errors import InvalidInput
from incidents.models import ReviewStatus
from incidents.reviews.content import MAX_FOLLOW_UP_TEXT, MAX_FOLLOW_UPS, MAX_TEXT
from incidents.reviews.durations import LINK_KEYS
from incidents.reviews.export import to_markdown
from incidents.reviews.report import team_incident_report
from incidents.reviews.writeup import load_review, may_edit, review_document, save_review

REPORT_DEFAULT_DAYS = 30
# What the review endpoints' errors mean, where it is more than what every endpoint says.
_ERRORS = {
    400: "Invalid body or parameters; `fields` says which and why.",
    403: "Refused: only on-call and above edit a review (`detail` says why), or no CSRF token.",
    404: "No such incident or team in your teams (other teams' ids look like missing ones).",
    409: "Somebody saved first (reload), the review is final, or the incident is not resolved.",
}


def error_responses(*codes: int) -> dict[int, OpenApiResponse]:
    return person_errors(*codes, texts=_ERRORS)


class FollowUpSerializer(serializers.Serializer):
    text = serializers.CharField(max_length=MAX_FOLLOW_UP_TEXT)
    owner = serializers.CharField(
        allow_null=True, required=False, help_text="Username of a member of the incident's team."
    )
    due_date = serializers.DateField(allow_null=True, required=False)
    done = serializers.BooleanField(default=False)


class ReviewIn(serializers.Serializer):
    revision = serializers.IntegerField(
        min_value=0,
        help_text="The revision this edit starts from (0: the automatic draft). When somebody "
        "saved in between, the answer is 409 and nothing is written.",
    )
    status = serializers.ChoiceField(
        choices=ReviewStatus.choices,
        default="draft",
        help_text="final: sign the review off; the incident (resolved) becomes reviewed.",
    )
    summary = serializers.CharField(allow_blank=True, max_length=MAX_TEXT, default="")
    impact = serializers.CharField(allow_blank=True, max_length=MAX_TEXT, default="")
    root_cause = serializers.CharField(allow_blank=True, max_length=MAX_TEXT, default="")
    contributing_factors = serializers.CharField(allow_blank=True, max_length=MAX_TEXT, default="")
    what_went_well = serializers.CharField(allow_blank=True, max_length=MAX_TEXT, default="")
    # many=True builds a ListSerializer, which takes max_length; the stubs type the child's
    # arguments only.
    follow_ups = FollowUpSerializer(  # type: ignore[call-arg]
        many=True, default=list, max_length=MAX_FOLLOW_UPS
    )


class TimelineRowOut(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.CharField()
    at = serializers.DateTimeField()
    actor = serializers.DictField(help_text='{"kind": system|person|agent, "username": …}')
    step = serializers.IntegerField(allow_null=True)
    message = serializers.CharField()
    # A declared field named like a Serializer attribute: DRF's metaclass moves it into the
    # serializer's fields; the stubs see a class attribute overriding the base's.
    data = serializers.DictField()  # type: ignore[assignment]
    alert_id = serializers.IntegerField(allow_null=True)


class LinkOut(serializers.Serializer):
    key = serializers.ChoiceField(choices=list(LINK_KEYS))
    # A declared field named like a Field attribute: DRF's metaclass moves it into the
    # serializer's fields; the stubs see a class attribute overriding the base's.
    label = serializers.CharField()  # type: ignore[assignment]
    seconds = serializers.FloatField(allow_null=True, help_text="null: not measured")
    steps = serializers.IntegerField(allow_null=True)
    start_at = serializers.DateTimeField(allow_null=True)
    end_at = serializers.DateTimeField(allow_null=True)
    end_kind = serializers.CharField(allow_null=True)


class DurationsOut(serializers.Serializer):
    links = LinkOut(many=True)
    slowest = serializers.CharField(allow_null=True)
    accelerator_hours = serializers.FloatField(allow_null=True)
    accelerators = serializers.IntegerField(allow_null=True)


class WriteUpOut(serializers.Serializer):
    status = serializers.ChoiceField(choices=ReviewStatus.choices)
    summary = serializers.CharField()
    impact = serializers.CharField()
    root_cause = serializers.CharField()
    contributing_factors = serializers.CharField()
    what_went_well = serializers.CharField()
    follow_ups = FollowUpSerializer(many=True)
    generated = serializers.BooleanField(help_text="true: the automatic draft, never saved")
    revision = serializers.IntegerField()
    updated_at = serializers.DateTimeField(allow_null=True)
    updated_by = serializers.CharField(allow_null=True)
    finalized_at = serializers.DateTimeField(allow_null=True)


class ReviewDocumentOut(serializers.Serializer):
    format = serializers.CharField()
    incident = serializers.DictField()
    job_size = serializers.DictField(allow_null=True)
    timeline = TimelineRowOut(many=True)
    durations = DurationsOut()
    review = WriteUpOut()
    revisions = serializers.ListField(child=serializers.DictField())
    can_edit = serializers.BooleanField(required=False, help_text="Only in GET …/review.")


class ReviewView(PersonView):
    @extend_schema(
        tags=["reviews"],
        summary="An incident's review: timeline, measured durations, write-up, revisions",
        responses={200: ReviewDocumentOut, **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        data = load_review(request.user, pk)
        document = review_document(data)
        document["can_edit"] = may_edit(request.user, data.incident)
        return Response(document)

    @extend_schema(
        tags=["reviews"],
        summary="Save the write-up (on-call and above); status final signs it off",
        request=ReviewIn,
        responses={200: ReviewDocumentOut, **error_responses(400, 401, 403, 404, 409)},
    )
    def put(self, request: Request, pk: int) -> Response:
        # ReviewIn documents the body; the service validates it (incidents.reviews.content),
        # so the API and the page's form name the same fields in their refusals.
        body = request.data if isinstance(request.data, dict) else {}  # not an object: refused
        revision = body.get("revision")
        if not isinstance(revision, int) or isinstance(revision, bool) or revision < 0:
            raise InvalidInput(
                "The review was refused.",
                fields={"revision": "the revision this edit starts from (0: the draft)"},
            )
        content = {key: value for key, value in body.items() if key != "revision"}
        save_review(
            signed_in(request), pk, content, base_revision=revision, context=audit_context(request)
        )
        return Response(review_document(load_review(request.user, pk)))


class ReviewJsonExportView(PersonView):
    @extend_schema(
        tags=["reviews"],
        summary="Export the review as JSON (complete: rebuilds the timeline elsewhere)",
        responses={200: ReviewDocumentOut, **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        response = Response(review_document(load_review(request.user, pk)))
        response["Content-Disposition"] = f'attachment; filename="incident-{pk}-review.json"'
        return response


class ReviewMarkdownExportView(PersonView):
    @extend_schema(
        tags=["reviews"],
        summary="Export the review as Markdown",
        responses={
            (200, "text/markdown"): OpenApiResponse(OpenApiTypes.STR),
            **error_responses(401, 404),
        },
    )
    def get(self, request: Request, pk: int) -> HttpResponse:
        text = to_markdown(review_document(load_review(request.user, pk)))
        response = HttpResponse(text, content_type="text/markdown; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="incident-{pk}-review.md"'
        return response


def report_period(since: str | None, until: str | None) -> tuple[datetime, datetime]:
    """``since``/``until`` as ISO dates or datetimes (UTC when naive); by default the last
    30 days. A date alone means its midnight, so until=2026-02-01 ends with January."""
    end = parse_moment(until, "until") if until else timezone.now()
    start = parse_moment(since, "since") if since else end - timedelta(days=REPORT_DEFAULT_DAYS)
    return start, end


class TeamIncidentReportView(PersonView):
    @extend_schema(
        tags=["reviews"],
        summary="A team's incidents over a period, with median and p90 of each link by level",
        description="Fire drills' incidents are left out; `drill_incidents` counts them.",
        parameters=[
            OpenApiParameter("since", OpenApiTypes.STR, description="ISO date or date-time"),
            OpenApiParameter("until", OpenApiTypes.STR, description="default: now"),
        ],
        responses={200: OpenApiTypes.OBJECT, **error_responses(400, 401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        since, until = report_period(
            request.query_params.get("since"), request.query_params.get("until")
        )
        return Response(team_incident_report(request.user, pk, since, until))
