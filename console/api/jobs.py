"""Jobs as people see them: always scoped to the teams the user belongs to."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.generics import ListAPIView, RetrieveAPIView

from breakers.control.confirmations import pause_confirmation
from breakers.control.job_actions import latest_pause
from breakers.metrics import latest_value
from console.api.person_auth import PersonView
from console.api.schema_fields import MetricValueField
from incidents.models import Job


class JobSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.name")
    latest_loss = MetricValueField(allow_null=True, read_only=True)

    class Meta:
        model = Job
        fields = [
            "id",
            "team",
            "name",
            "kind",
            "status",
            "agent_status",
            "current_step",
            "step_time_seconds",
            "last_heartbeat_at",
            "last_metric_at",
            "heartbeat_deadline",
            "world_size",
            "latest_loss",
            # A fire drill's sandbox: its alerts page nobody; the drill pages list it.
            "drill_sandbox",
        ]


class JobDetailSerializer(JobSerializer):
    pause = serializers.SerializerMethodField(
        help_text="The latest checkpoint_and_pause (id, status, error) and its confirmation: "
        "the decision, the resume it issued and, when the job refused it (a roll back whose "
        "checkpoint did not check out), the job's reason; null when the job was never paused."
    )

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "pause"]

    def get_pause(self, job: Job) -> dict[str, Any] | None:
        pause = latest_pause(job.pk)
        if pause is None:
            return None
        confirmation = pause_confirmation(pause.pk)
        return {
            "id": pause.pk,
            "status": pause.status,
            "error": pause.error,
            "confirmation": confirmation.as_dict() if confirmation is not None else None,
        }


def visible_jobs(user) -> QuerySet[Job]:
    """Jobs of the user's teams only; anything else is invisible (404, never 403)."""
    return (
        Job.objects.filter(team__memberships__user=user)
        .select_related("team")
        .annotate(latest_loss=latest_value("loss"))
        .order_by("team__name", "name")
    )


@extend_schema(tags=["jobs"])
class JobListView(ListAPIView):
    # A browser session or a personal token, like every person-facing endpoint.
    authentication_classes = PersonView.authentication_classes
    parser_classes = PersonView.parser_classes
    serializer_class = JobSerializer

    def get_queryset(self) -> QuerySet[Job]:
        return visible_jobs(self.request.user)


@extend_schema(tags=["jobs"])
class JobDetailView(RetrieveAPIView):
    authentication_classes = PersonView.authentication_classes
    parser_classes = PersonView.parser_classes
    serializer_class = JobDetailSerializer

    def get_queryset(self) -> QuerySet[Job]:
        return visible_jobs(self.request.user)
