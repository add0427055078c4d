"""The re-run findings of a brake's acknowledgement (breakers.recovery.attribution), each with
the node of its rank as the job's heartbeats name it: what the timeline flags and the
recovery verdict weighs."""

from __future__ import annotations

from dataclasses import replace

from breakers.models import Command
from breakers.recovery.attribution import Rerun, reported
from incidents.models import JobRank


def reruns_of(command: Command) -> list[Rerun]:
    """The findings ``command``'s acknowledgement carries, by rank, with their nodes (a
    single-process job's is its rank 0's)."""
    found = reported(command.result)
    if not found:
        return []
    hosts = dict(
        JobRank.objects.filter(
            job_id=command.job_id, rank__in=[r.rank or 0 for r in found]
        ).values_list("rank", "hostname")
    )
    return [replace(r, node=hosts.get(r.rank or 0, "")) for r in found]
