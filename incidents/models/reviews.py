"""The post-incident review's records: the job's declared size, the write-up, its follow-ups and
every revision of it (docs/design.md "Reviews and measured durations").

Imported at the end of ``incidents.models`` so Django registers them with the app.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from core.append_only import AppendOnlyModel
from incidents.models.alerts import Incident
from incidents.models.jobs import Job

__all__ = [
    "REVIEW_TRANSITIONS",
    "FollowUp",
    "JobSize",
    "JobSizeSource",
    "Review",
    "ReviewRevision",
    "ReviewStatus",
]


class JobSizeSource(models.TextChoices):
    DECLARED = "declared", "Declared"  # by a person: what the job was given; always wins
    REPORTED = "reported", "Reported"  # by the job: its hosts and the accelerators it saw


class JobSize(models.Model):
    """What the job occupies: the accelerators a late brake keeps burning
    (``incidents.job_size``)."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="size")
    nodes = models.PositiveIntegerField()
    gpus_per_node = models.PositiveIntegerField()
    accelerator = models.CharField(max_length=100, blank=True, help_text="e.g. H100 80GB")
    source = models.CharField(
        max_length=16, choices=JobSizeSource.choices, default=JobSizeSource.DECLARED
    )
    declared_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(nodes__gte=1), name="job_size_nodes")]

    def __str__(self) -> str:
        return f"{self.job}: {self.nodes} × {self.gpus_per_node}"


class ReviewStatus(models.TextChoices):
    DRAFT = "draft", "Draft"
    FINAL = "final", "Final"  # the incident is reviewed; the write-up no longer changes


REVIEW_TRANSITIONS: dict[str, set[str]] = {
    ReviewStatus.DRAFT: {ReviewStatus.FINAL},
    ReviewStatus.FINAL: set(),
}


class Review(models.Model):
    """The write-up of one incident. Stored on the first edit: until then the page shows the
    automatic draft, computed afresh from the timeline (``incidents.reviews.draft``)."""

    incident = models.OneToOneField(Incident, on_delete=models.PROTECT, related_name="review")
    status = models.CharField(
        max_length=8, choices=ReviewStatus.choices, default=ReviewStatus.DRAFT
    )
    # The sections of incidents.reviews.content.TEXT_FIELDS, in the order pages show them.
    summary = models.TextField(blank=True)
    impact = models.TextField(blank=True)
    root_cause = models.TextField(blank=True)
    contributing_factors = models.TextField(blank=True)
    what_went_well = models.TextField(blank=True)
    # The number of the latest revision; an edit names the revision it was based on, and the
    # save is a compare-and-swap on it, so two writers never silently overwrite each other.
    revision = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField()
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    finalized_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"review of incident #{self.incident_id} ({self.status}, r{self.revision})"


class FollowUp(models.Model):
    review = models.ForeignKey(Review, on_delete=models.CASCADE, related_name="follow_ups")
    position = models.PositiveIntegerField()
    text = models.CharField(max_length=1000)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="review_follow_ups",
    )
    due_date = models.DateField(null=True, blank=True)
    done = models.BooleanField(default=False)

    class Meta:
        ordering = ["review_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["review", "position"], name="follow_up_position")
        ]

    def __str__(self) -> str:
        return self.text


class ReviewRevision(AppendOnlyModel):
    """Every saved state of a write-up: who, when, and the whole content as JSON. Revision 1
    is the automatic draft (no author) the first writer started from. Append-only."""

    append_only_noun = "Review revisions"

    review = models.ForeignKey(Review, on_delete=models.PROTECT, related_name="revisions")
    number = models.PositiveIntegerField()
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, related_name="+"
    )
    at = models.DateTimeField()
    content = models.JSONField()

    class Meta:
        ordering = ["review_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["review", "number"], name="review_revision_number")
        ]

    def __str__(self) -> str:
        return f"r{self.number} of {self.review}"
