"""Sharded parameters: what the step guard does when each rank holds only part of a tensor.

Under FSDP (torch's ``fully_shard``) and tensor parallelism, parameters and their gradients are
``DTensor``s: each rank keeps one shard, and the gradients are reduce-scattered, so a
non-finite element lives on one rank only (a NaN loss spreads to every shard; a corrupted
element does not). Every rank must still refuse the same update, or the ranks' weights part and
the next collective waits forever on a rank that holds.

The guard therefore checks this rank's own shards (local tensors: no collective per
parameter, which an operation on the ``DTensor`` itself would cost), folds them and the
loss flags into one flag, and agrees on it with one all-reduce (MAX) over each group of the
parameters' device meshes, as AMP's ``ShardedGradScaler`` agrees on its overflow flag. The
all-reduce stays on the device: no host sync. Every rank of a mesh calls the optimizer's step
for it, so every rank takes part, one with nothing to check included (an empty shard).
"""

from __future__ import annotations

import functools
from typing import Any

from brakeline._flags import any_flag


@functools.cache
def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed support
        return None
    return DTensor


def is_sharded(tensor: Any) -> bool:
    # Only a class named DTensor can be one: a plain tensor never imports torch.distributed.
    if type(tensor).__name__ != "DTensor":
        return False
    dtensor = _dtensor_type()
    return dtensor is not None and isinstance(tensor, dtensor)


def local(tensor: Any) -> Any:
    """This rank's shard of a ``DTensor`` (its own storage, writable in place), or ``tensor``."""
    return tensor.to_local() if is_sharded(tensor) else tensor


def mesh_groups(tensors: list[Any]) -> list[Any]:
    """The process groups of the device meshes ``tensors`` are sharded over, each once."""
    meshes: dict[int, Any] = {}
    for tensor in tensors:
        if is_sharded(tensor):
            meshes.setdefault(id(tensor.device_mesh), tensor.device_mesh)
    groups: list[Any] = []
    for mesh in meshes.values():
        for group in mesh.get_all_groups():
            if group not in groups:
                groups.append(group)
    return groups


def agree(flags: list[Any], groups: list[Any], device: Any) -> list[Any]:
    """One flag, set on every rank of ``groups`` if any rank's ``flags`` had one set."""
    import torch
    import torch.distributed as dist

    flag = any_flag(flags, device).to(torch.float32)
    for group in groups:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return [flag > 0]
