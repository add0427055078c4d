"""A drill's checkpoint line reads the catalogue as a roll back would: which checkpoint it would
offer, and whether the brake itself saved one."""

from __future__ import annotations

from typing import Any

from breakers.checkpoints import catalogue
from breakers.models import Checkpoint, Command, CommandKind
from incidents.models import Job


def checkpoint_facts(
    job: Job, brake: Command | None, chosen_id: int | None = None
) -> dict[str, Any] | None:
    """What a roll back would offer first (the catalogue's preselected clean entry: the
    brake's own checkpoint when it is clean), else the brake's own, else the newest one.
    After an lr_spike the brake's save holds the diverged updates: the catalogue then offers
    the periodic one before the anomaly, and that is the one to restart from. ``chosen_id``:
    the checkpoint a drill's automatic recovery rolled back to, scored instead."""
    entries = catalogue(job.pk)
    chosen = next((e["id"] for e in entries if e["preselected"]), None)
    wanted = chosen_id or chosen
    row = Checkpoint.objects.filter(job=job, pk=wanted).first() if wanted else None
    if row is None and brake is not None and brake.kind == CommandKind.CHECKPOINT_AND_PAUSE:
        row = Checkpoint.objects.filter(job=job, command_id=brake.pk).first()
    if row is None and entries:
        row = Checkpoint.objects.get(pk=entries[0]["id"])
    if row is None:
        return None
    fields = ("path", "sha256", "step", "weights_step", "reason")
    facts = {name: getattr(row, name) for name in fields}
    brake_saved = brake is not None and Checkpoint.objects.filter(command_id=brake.pk).exists()
    return {**facts, "brake_saved": brake_saved}
