"""The step guard's flags: 0-d bool tensors that say "refuse this update", kept on the device.

The bottom of the guard's tensor code: its device path (``_guard_device``) folds a fused
optimizer's own ``found_inf`` into the guard's flag, and the sharded path (``_shards``) folds
this rank's shards' flags into the one it agrees on with the other ranks. Both fold the same
way, here.
"""

from __future__ import annotations

from typing import Any


def any_flag(flags: list[Any], device: Any) -> Any:
    """One 0-d bool tensor on ``device``: True if any of ``flags`` is (device copies only)."""
    import torch

    moved = [flag.to(device, non_blocking=True).reshape(()) for flag in flags]
    return torch.stack(moved).any() if moved else torch.zeros((), dtype=torch.bool, device=device)
