"""Capturing and restoring every random number generator a training loop may draw from.

States are stored as plain lists/ints/tensors so a checkpoint loads with
``torch.load(weights_only=True)``. NumPy and torch are only touched when the program already
imported them: a generator the program never imported cannot have been drawn from.
"""

from __future__ import annotations

import random
import sys
from typing import Any


def generator_states(include_cuda: bool = True) -> dict[str, Any]:
    """Every generator's state as its library hands it out, unconverted: cheap enough to take
    every step, for putting back in this same process (brakeline._attribute)."""
    state: dict[str, Any] = {"python": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch_cpu"] = torch.get_rng_state()
        if include_cuda and torch.cuda.is_available() and torch.cuda.is_initialized():
            state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_generator_states(state: dict[str, Any]) -> None:
    """Put back what :func:`generator_states` took (in the same process)."""
    if "python" in state:
        random.setstate(state["python"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
    if "torch_cpu" in state:
        import torch

        torch.set_rng_state(state["torch_cpu"])
        cuda_states = state.get("torch_cuda")
        if cuda_states and torch.cuda.is_available():
            if len(cuda_states) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(cuda_states)
            else:
                # A different GPU count cannot reproduce the old streams anyway; seed what exists.
                for index, cuda_state in enumerate(cuda_states[: torch.cuda.device_count()]):
                    torch.cuda.set_rng_state(cuda_state, index)


def capture_rng_state(include_cuda: bool = True) -> dict[str, Any]:
    """Python ``random``, NumPy's global generator, torch CPU and (if in use) CUDA generators,
    as plain lists and numbers (a checkpoint's, loadable with ``weights_only=True``)."""
    state = generator_states(include_cuda)
    version, internal, gauss_next = state["python"]
    state["python"] = {"version": version, "internal": list(internal), "gauss_next": gauss_next}
    if "numpy" in state:
        name, keys, position, has_gauss, cached_gaussian = state["numpy"]
        state["numpy"] = {
            "name": name,
            "keys": [int(key) for key in keys],
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        }
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put every generator captured by :func:`capture_rng_state` back where it was."""
    raw = dict(state)
    if "python" in state:
        python = state["python"]
        raw["python"] = (python["version"], tuple(python["internal"]), python["gauss_next"])
    if "numpy" in state:
        import numpy

        saved = state["numpy"]
        raw["numpy"] = (
            saved["name"],
            numpy.asarray(saved["keys"], dtype=numpy.uint32),
            saved["position"],
            saved["has_gauss"],
            saved["cached_gaussian"],
        )
    set_generator_states(raw)


def seed_everything(seed: int) -> dict[str, int]:
    """Seed Python, NumPy (if imported) and torch (if imported); return what was seeded."""
    random.seed(seed)
    seeded = {"python": seed}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)
        seeded["numpy"] = seed % 2**32
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)  # also seeds every CUDA device
        seeded["torch"] = seed
    return seeded
