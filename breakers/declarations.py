"""Declaring what is a job's: its inference servers and its checkpoint root (team admins).

The service every front door calls (the API, the admin's forms check the same rules). These are
the trusted side of ``breakers.executors.targets``: an agent reports, a team admin declares.
Each change is audited as ``manage_members`` (team administration: admins only).
"""

from __future__ import annotations

import re
from typing import Any

from django.db import IntegrityError, transaction

from breakers.executors.targets import normalise_root, under
from breakers.models import CheckpointRoot, InferenceServer
from core.errors import Conflict, InvalidInput
from incidents.models import Job, Team
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import AuditContext, audited
from incidents.teams.authority import Action, decide
from incidents.teams.users import User

NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,100}$")
MAX_SERVERS = 1000


def parse_servers(data: Any) -> list[tuple[str, str]]:
    """``{"servers": [{"backend": "…", "server": "…"}, …]}`` → pairs; 400 naming the field."""
    servers = data.get("servers") if isinstance(data, dict) else None
    if not isinstance(servers, list) or len(servers) > MAX_SERVERS:
        raise InvalidInput(
            "servers must be a list.", fields={"servers": f"a list of at most {MAX_SERVERS}"}
        )
    pairs: list[tuple[str, str]] = []
    for index, item in enumerate(servers):
        ok = isinstance(item, dict) and set(item) == {"backend", "server"}
        if not ok or not all(isinstance(v, str) and NAME.match(v) for v in item.values()):
            raise InvalidInput(
                "Each server is {backend, server}.",
                fields={f"servers[{index}]": "backend and server: 1-100 of A-Z a-z 0-9 _ . : -"},
            )
        pairs.append((item["backend"], item["server"]))
    if len(set(pairs)) != len(pairs):
        raise InvalidInput("A server is named twice.", fields={"servers": "each server once"})
    return pairs


def _admin_job(user: User, job_id: int, attempt: Any) -> Job:
    job = scoped_get(Job.objects, user, job_id, team_path="team_id", noun="job", attempt=attempt)
    attempt.team_id = job.team_id
    attempt.check(decide(role_in_team(user, job.team_id), Action.MANAGE_MEMBERS))
    return job


def declare_inference_servers(
    user: User, job_id: int, data: Any, *, context: AuditContext | None = None
) -> list[InferenceServer]:
    """Replace the job's declared servers. 409 when one is declared for another job."""
    with audited(user, Action.MANAGE_MEMBERS, "job", job_id, context) as attempt:
        job = _admin_job(user, job_id, attempt)
        pairs = parse_servers(data)
        taken = InferenceServer.objects.exclude(job=job).filter(
            backend__in={b for b, _ in pairs}, server__in={s for _, s in pairs}
        )
        clash = [f"{r.backend}/{r.server}" for r in taken if (r.backend, r.server) in pairs]
        if clash:
            raise Conflict(f"Declared for another job already: {', '.join(clash[:5])}.")
        try:
            with transaction.atomic():
                InferenceServer.objects.filter(job=job).delete()
                InferenceServer.objects.bulk_create(
                    InferenceServer(job=job, backend=b, server=s, declared_by=user)
                    for b, s in pairs
                )
        except IntegrityError:  # declared for another job meanwhile
            raise Conflict("A server was declared for another job meanwhile.") from None
        attempt.succeeded(f"inference servers of {job.name}: {len(pairs)}")
    return list(InferenceServer.objects.filter(job=job))


def servers_out(job: Job) -> dict[str, Any]:
    rows = InferenceServer.objects.filter(job=job)
    return {"servers": [{"backend": r.backend, "server": r.server} for r in rows]}


def parse_root(data: Any) -> str:
    root = data.get("root") if isinstance(data, dict) else None
    if not isinstance(root, str) or len(root) > 1000 or "\x00" in root:
        raise InvalidInput("root must be a path.", fields={"root": "a path or '' to remove it"})
    if not root.strip():
        return ""
    try:
        return normalise_root(root)
    except ValueError as error:
        raise InvalidInput(f"root {error}.", fields={"root": str(error)}) from None


def _refuse_overlap(team_id: int, root: str) -> None:
    """One team's root never holds, nor lies under, another team's."""
    if not root:
        return
    others = CheckpointRoot.objects.exclude(team_id=team_id).values_list("root", flat=True)
    for other in others:
        if under(root, other) or under(other, root):
            raise Conflict(f"{root} overlaps another team's checkpoint root.")


def declare_checkpoint_root(
    user: User,
    team_id: int,
    data: Any,
    *,
    job_id: int | None = None,
    context: AuditContext | None = None,
) -> str:
    """Set (or, with ``""``, remove) the team's checkpoint root, or one job's; the root now."""
    target = ("job", job_id) if job_id is not None else ("team", team_id)
    with audited(user, Action.MANAGE_MEMBERS, target[0], target[1], context) as attempt:
        if job_id is not None:
            team_id = _admin_job(user, job_id, attempt).team_id
        else:
            team = scoped_get(
                Team.objects, user, team_id, team_path="id", noun="team", attempt=attempt
            )
            attempt.team_id = team.pk
            attempt.check(decide(role_in_team(user, team.pk), Action.MANAGE_MEMBERS))
        root = parse_root(data)
        _refuse_overlap(team_id, root)
        rows = CheckpointRoot.objects.filter(team_id=team_id)
        rows = rows.filter(job_id=job_id) if job_id is not None else rows.filter(job__isnull=True)
        with transaction.atomic():
            rows.delete()
            if root:
                CheckpointRoot.objects.create(
                    team_id=team_id, job_id=job_id, root=root, declared_by=user
                )
        attempt.succeeded(f"checkpoint root of {target[0]} {target[1]}: {root or 'removed'}")
    return root


def declare_own_root(job: Job, folder: str) -> str:
    """The console's own jobs (a drill's sandbox, the demo's run) write their checkpoints in
    folders the console chose: it declares that folder as the job's root itself, as the
    system (nobody's name sent by an agent). Returns the root as stored."""
    root = normalise_root(folder)
    CheckpointRoot.objects.update_or_create(
        team_id=job.team_id, job=job, defaults={"root": root, "declared_by": None}
    )
    return root
