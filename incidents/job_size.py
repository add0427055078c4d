"""What a job occupies: the accelerators a late brake keeps burning, for a review's
accelerator-hours.

Two sources, one row per job (``JobSize``):

- **declared** by a person who may create jobs (``manage.py create_job --nodes … --gpus-per-node
  …``, ``PUT /api/v1/jobs/{id}/size``, the admin): what the job was given. It always wins.
- **reported** by the job itself: the console counts the hosts its ranks heartbeat from and the
  accelerators its environment snapshot saw on a host (``report_job_size``, called on each
  snapshot). A reported size never replaces a declared one.

Declaring is the manager's, as creating the job is: the size is part of describing what the
team runs.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from core.errors import InvalidInput
from incidents.models import Job, JobSize, JobSizeSource
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import AuditContext, audited
from incidents.teams.authority import Action, decide

MAX_NODES = 100_000
MAX_PER_NODE = 1_024
MAX_NAME = 100


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def parse_job_size(data: Any) -> tuple[int, int, str]:
    """(nodes, accelerators per node, accelerator name) from a request body, or 400 naming
    each bad field."""
    if not isinstance(data, dict):
        raise InvalidInput("The job size must be an object.", fields={"body": "must be an object"})
    errors = {}
    nodes, per_node = data.get("nodes"), data.get("gpus_per_node")
    accelerator = data.get("accelerator", "")
    for key in data.keys() - {"nodes", "gpus_per_node", "accelerator"}:
        errors[str(key)[:60]] = "is not a field of a job size (nodes, gpus_per_node, accelerator)"
    if not _whole(nodes, 1, MAX_NODES):
        errors["nodes"] = f"must be a whole number from 1 to {MAX_NODES}"
    if not _whole(per_node, 0, MAX_PER_NODE):
        errors["gpus_per_node"] = f"must be a whole number from 0 to {MAX_PER_NODE}"
    if not isinstance(accelerator, str) or len(accelerator) > MAX_NAME or "\x00" in accelerator:
        errors["accelerator"] = f"must be a string of at most {MAX_NAME} characters"
    if errors:
        raise InvalidInput("The job size was refused.", fields=errors)
    assert isinstance(nodes, int) and isinstance(per_node, int)  # or an error was written
    return nodes, per_node, accelerator.strip()


def declare_job_size(
    job_id: int, *, nodes: int, gpus_per_node: int, accelerator: str = ""
) -> JobSize:
    """Record what the job was given (accelerator-hours of a review are computed from it)."""
    nodes, gpus_per_node, accelerator = parse_job_size(
        {"nodes": nodes, "gpus_per_node": gpus_per_node, "accelerator": accelerator}
    )
    size, _ = JobSize.objects.update_or_create(
        job_id=job_id,
        defaults={
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "accelerator": accelerator,
            "source": JobSizeSource.DECLARED,
        },
    )
    return size


def declare_job_size_as(
    user: Any, job_id: int, data: Any, context: AuditContext | None = None
) -> JobSize:
    """A person declares the job's size: who may create the team's jobs may say what they
    occupy (audited like every person's action)."""
    with audited(user, Action.CREATE_JOB, "job", job_id, context) as attempt:
        job = scoped_get(
            Job.objects, user, job_id, team_path="team_id", noun="job", attempt=attempt
        )
        attempt.team_id = job.team_id
        attempt.check(decide(role_in_team(user, job.team_id), Action.CREATE_JOB))
        nodes, per_node, accelerator = parse_job_size(data)
        return declare_job_size(
            job.pk, nodes=nodes, gpus_per_node=per_node, accelerator=accelerator
        )


def report_job_size(job_id: int, *, nodes: int, per_node: int, accelerator: str) -> None:
    """What the job's own reports say it occupies; kept only while nobody declared a size."""
    defaults = {
        "nodes": max(1, min(nodes, MAX_NODES)),
        "gpus_per_node": max(0, min(per_node, MAX_PER_NODE)),
        "accelerator": accelerator[:MAX_NAME],
        "source": JobSizeSource.REPORTED,
    }
    with transaction.atomic():
        declared = JobSize.objects.select_for_update().filter(
            job_id=job_id, source=JobSizeSource.DECLARED
        )
        if not declared.exists():
            JobSize.objects.update_or_create(job_id=job_id, defaults=defaults)


def size_out(size: JobSize | None) -> dict[str, Any] | None:
    if size is None:
        return None
    return {
        "nodes": size.nodes,
        "gpus_per_node": size.gpus_per_node,
        "accelerator": size.accelerator,
        "accelerators": size.nodes * size.gpus_per_node,
        "source": size.source,
    }
