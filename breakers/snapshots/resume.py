"""A resume whose environment differs from its checkpoint's is an L1: "environment changed
across resume: …" (docs/design.md "Environment snapshots").

Called when a ``resume`` snapshot is stored, in the same transaction: the snapshot names the
checkpoint it resumed from (sha256, else path); the checkpoint's own snapshot is the
reference. A difference in packages, seeds, the container image or the data-loader position
raises the alert through the ordinary lifecycle (incident, timeline, notification); the alert
says what changed, and its runbook entry ("metrics differ after resume") links to the diff.
Differences elsewhere (hardware, scheduler, environment variables) are shown on the diff page
but raise nothing: a resume on another node is normal.
"""

from __future__ import annotations

from django.db.models import Q

from breakers.models import EnvironmentSnapshot, SnapshotKind
from breakers.snapshots.diff import describe_resume_change, diff_snapshots
from core.text import fit
from incidents.alerts.lifecycle import AlertSignal, raise_or_update_alert
from incidents.notifications.rounds import notify_alert

RESUME_RULE_KEY = "environment-changed-across-resume"
RESUME_RULE_NAME = "Environment changed across resume"
DESCRIPTION_LENGTH = 900


def checkpoint_snapshot_for(resume: EnvironmentSnapshot) -> EnvironmentSnapshot | None:
    """The snapshot taken when the checkpoint this resume names was written."""
    same = Q(checkpoint_sha256=resume.checkpoint_sha256) if resume.checkpoint_sha256 else Q()
    if not same and not resume.checkpoint_path:
        return None
    candidates = EnvironmentSnapshot.objects.filter(
        job_id=resume.job_id, kind=SnapshotKind.CHECKPOINT
    )
    by_hash = candidates.filter(same).order_by("-taken_at").first() if same else None
    return by_hash or (
        candidates.filter(checkpoint_path=resume.checkpoint_path).order_by("-taken_at").first()
    )


def check_resume(resume: EnvironmentSnapshot) -> int | None:
    """Raise the L1 when the resume changed what its metrics depend on; the alert id or None."""
    reference = checkpoint_snapshot_for(resume)
    if reference is None:
        return None
    diff = diff_snapshots(reference.data, resume.data)
    if not diff.resume_critical:
        return None
    what = describe_resume_change(diff)
    signal = AlertSignal(
        rule_key=RESUME_RULE_KEY,
        rule_name=RESUME_RULE_NAME,
        layer="stability",
        severity="L1",
        metric="environment",
        node="",
        value=float(len(diff.resume_critical)),
        threshold=None,
        description=fit(f"environment changed across resume: {what}", DESCRIPTION_LENGTH),
        step=resume.step,
        time=resume.taken_at,
        first_step=reference.step,
        first_time=reference.taken_at,
        action="notify",
        action_params={"snapshot_before": reference.pk, "snapshot_after": resume.pk},
        runbook_hint="metrics_differ_after_resume",
    )
    outcome = raise_or_update_alert(resume.job_id, signal, now=resume.taken_at)
    if outcome.action_due:
        notify_alert(outcome.alert.pk)  # after commit
    return outcome.alert.pk
