"""Reading a job's snapshots: the list, a diff between two, the readiness grade.

One function per question, called by the API (``console.api.snapshots``), the pages and the
template tags alike. Team scoping is the caller's (it passes a job it may see); a snapshot id
of another job is "not found" here, exactly like one that does not exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC
from typing import Any

from breakers.models import EnvironmentSnapshot, InferenceReplica, SnapshotKind
from breakers.snapshots.diff import SnapshotDiff, diff_snapshots
from breakers.snapshots.readiness import Readiness, grade
from breakers.snapshots.resume import checkpoint_snapshot_for
from core.errors import InvalidInput, NotFound
from incidents.models import Job

SUMMARY_FIELDS = ("id", "kind", "step", "taken_at", "checkpoint_path", "checkpoint_sha256")


def summary(snapshot: EnvironmentSnapshot) -> dict[str, Any]:
    return {
        "id": snapshot.pk,
        "kind": snapshot.kind,
        "step": snapshot.step,
        "taken_at": snapshot.taken_at.isoformat(),
        "taken_at_display": snapshot.taken_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "checkpoint": {"path": snapshot.checkpoint_path, "sha256": snapshot.checkpoint_sha256}
        if snapshot.checkpoint_sha256
        else None,
    }


def job_snapshots(job_id: int, limit: int = 200) -> list[EnvironmentSnapshot]:
    """The job's snapshots, newest first, without their (large) documents."""
    rows = EnvironmentSnapshot.objects.filter(job_id=job_id).only(*SUMMARY_FIELDS, "job_id")
    return list(rows.order_by("-taken_at", "-pk")[:limit])


def job_replicas(job_id: int) -> list[InferenceReplica]:
    """An inference job's replicas, as their heartbeats and the L3 response left them."""
    return list(InferenceReplica.objects.filter(job_id=job_id).order_by("backend", "name"))


def latest_snapshot(job_id: int) -> EnvironmentSnapshot | None:
    return EnvironmentSnapshot.objects.filter(job_id=job_id).order_by("-taken_at", "-pk").first()


def job_readiness(job_id: int) -> Readiness:
    latest = latest_snapshot(job_id)
    kind = Job.objects.values_list("kind", flat=True).get(pk=job_id)
    return grade(latest.data if latest is not None else None, kind)


def readiness_of_jobs(job_ids: list[int]) -> dict[int, Readiness]:
    """Each job's grade from its latest snapshot, in one query (the dashboard's rows)."""
    latest: dict[int, EnvironmentSnapshot] = {}
    rows = EnvironmentSnapshot.objects.filter(job_id__in=job_ids).order_by(
        "job_id", "-taken_at", "-pk"
    )
    for row in rows.distinct("job_id") if _postgres() else rows:
        latest.setdefault(row.job_id, row)
    kinds = dict(Job.objects.filter(pk__in=job_ids).values_list("pk", "kind"))
    return {
        job_id: grade(latest[job_id].data if job_id in latest else None, kinds.get(job_id, ""))
        for job_id in job_ids
    }


def _postgres() -> bool:
    from django.db import connection

    return connection.vendor == "postgresql"


@dataclass(frozen=True)
class DiffView:
    before: EnvironmentSnapshot
    after: EnvironmentSnapshot
    diff: SnapshotDiff
    why: str  # how the pair was chosen

    def as_dict(self) -> dict[str, Any]:
        return {
            "before": summary(self.before),
            "after": summary(self.after),
            "chosen": self.why,
            **self.diff.as_dict(),
        }


def _check_id(raw: str, name: str) -> int:
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise InvalidInput(f"Bad {name}.", fields={name: "a snapshot id (a whole number)"})
    return int(raw)


def _one(job_id: int, raw: str, name: str) -> EnvironmentSnapshot:
    found = EnvironmentSnapshot.objects.filter(job_id=job_id, pk=_check_id(raw, name)).first()
    if found is None:
        raise NotFound(f"This job has no snapshot {raw}.")
    return found


def latest_resume_pair(job_id: int) -> tuple[EnvironmentSnapshot, EnvironmentSnapshot] | None:
    resumes = EnvironmentSnapshot.objects.filter(job_id=job_id, kind=SnapshotKind.RESUME)
    for resume in resumes.order_by("-taken_at", "-pk")[:20]:
        reference = checkpoint_snapshot_for(resume)
        if reference is not None:
            return reference, resume
    return None


def choose_diff(job_id: int, a: str = "", b: str = "", mode: str = "") -> DiffView | None:
    """``a``/``b`` given: those two. ``mode="resume"`` or nothing given: the latest resume
    against its checkpoint's snapshot, else the job's two latest snapshots. None: fewer than
    two snapshots."""
    if a or b:
        if not (a and b):
            missing = "b" if a else "a"
            raise InvalidInput("Name both snapshots.", fields={missing: "a snapshot id"})
        _check_id(a, "a"), _check_id(b, "b")  # the format of both before any lookup
        before, after = _one(job_id, a, "a"), _one(job_id, b, "b")
        return DiffView(before, after, diff_snapshots(before.data, after.data), "chosen")
    if mode not in ("", "resume", "latest"):
        raise InvalidInput("Bad diff.", fields={"diff": "resume or latest"})
    pair = latest_resume_pair(job_id) if mode in ("", "resume") else None
    if pair is not None:
        return DiffView(*pair, diff_snapshots(pair[0].data, pair[1].data), "resume")
    latest = list(
        EnvironmentSnapshot.objects.filter(job_id=job_id).order_by("-taken_at", "-pk")[:2]
    )
    if len(latest) < 2:
        return None
    before, after = latest[1], latest[0]
    return DiffView(before, after, diff_snapshots(before.data, after.data), "latest")
