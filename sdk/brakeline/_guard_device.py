"""The step guard's device path: an update refused on the device, without a host read.

On an accelerator, reading the guard's flag in the step that computes it would stall the host
until the device has caught up, every step. Instead the flag stays on the device and the update
is made conditional on it there:

- **fused optimizers** (``torch.optim`` Adam, AdamW and SGD built with ``fused=True``) take the
  flag as ``found_inf``, exactly as AMP's GradScaler hands them its overflow flag: the kernel
  leaves the parameters, the moments and the step count untouched when it is set;
- **every other optimizer** is masked: before the step, the parameters it may change and their
  optimizer state are copied on the device; after it, ``torch.where(flag, copy, new)`` puts the
  copies back where the flag is set. The copies cost one more set of the parameters and of the
  optimizer state (for Adam: three times the parameters' size) for the duration of the step,
  plus the device bandwidth to write and read them once.

Optimizer state kept in host memory (a 0-d CPU tensor, as torch's non-capturable optimizers keep
their step counts) cannot be masked by a device flag without a sync: its values before the step
are kept and put back when the flag is read on the host, one step later, before the next update
(which the guard refuses too, since it learns of the trip only then). State the step created
(a parameter's first update) is dropped then, so the optimizer starts it afresh.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from brakeline._flags import any_flag
from brakeline._shards import local


def primary_device(optimizer: Any) -> Any:
    for parameter in _parameters(optimizer):
        return parameter.device
    return None


def _parameters(optimizer: Any) -> Iterator[Any]:
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            if getattr(parameter, "grad", None) is not None:
                yield parameter


def takes_found_inf(optimizer: Any) -> bool:
    """torch's fused optimizers skip their update on a device ``found_inf`` flag."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False)) and all(
        group.get("fused") for group in optimizer.param_groups
    )


def _on_host(tensor: Any, device: Any) -> bool:
    # State the device flag cannot reach without a sync: a host scalar (a step count), or a
    # tensor in host memory while the flag lives on an accelerator.
    return tensor.device.type == "cpu" and (tensor.dim() == 0 or device.type != "cpu")


class HostState:
    """Optimizer state in host memory as it was before a masked step, restorable later."""

    def __init__(self, optimizer: Any) -> None:
        self._optimizer = optimizer
        self._kept: list[tuple[Any, dict[str, Any] | None]] = []

    def keep(self, parameter: Any, state: dict[str, Any] | None, device: Any) -> None:
        if state is None:  # the step creates it: dropped again if the step is refused
            self._kept.append((parameter, None))
            return
        host = {
            key: value.clone()
            for key, value in state.items()
            if hasattr(value, "device") and _on_host(value, device)
        }
        if host:
            self._kept.append((parameter, host))

    def restore(self) -> None:
        state = self._optimizer.state
        for parameter, kept in self._kept:
            if kept is None:
                state.pop(parameter, None)
                continue
            for key, value in kept.items():
                state[parameter][key].copy_(value)


class DeviceMask:
    """Copies of what one optimizer step may change, put back where the device flag is set."""

    def __init__(self, optimizer: Any, device: Any) -> None:
        import torch

        self._optimizer = optimizer
        self._device = device
        self.host = HostState(optimizer)
        self._params: list[tuple[Any, Any]] = []
        self._state: list[tuple[Any, dict[str, Any]]] = []
        with torch.no_grad():
            for parameter in _parameters(optimizer):
                # A sharded parameter: this rank's shard, masked in place (no collective).
                shard = local(parameter.detach())
                self._params.append((shard, shard.clone()))
                state = optimizer.state.get(parameter)
                self.host.keep(parameter, state, device)
                if state is None:
                    self._state.append((parameter, {}))
                    continue
                self._state.append(
                    (
                        parameter,
                        {
                            key: local(value.detach()).clone()
                            for key, value in state.items()
                            if hasattr(value, "device") and not _on_host(value, device)
                        },
                    )
                )

    def apply(self, flag: Any) -> None:
        """Where ``flag`` (0-d bool on the device) is set, undo the step on the device."""
        import torch

        flags: dict[Any, Any] = {}

        def flag_on(device: Any) -> Any:
            if device not in flags:
                flags[device] = flag.to(device, non_blocking=True)
            return flags[device]

        with torch.no_grad():
            for parameter, before in self._params:
                parameter.copy_(torch.where(flag_on(parameter.device), before, parameter))
            for parameter, before_state in self._state:
                for key, state_value in self._optimizer.state.get(parameter, {}).items():
                    if not hasattr(state_value, "device") or _on_host(state_value, self._device):
                        continue
                    value = local(state_value.detach())
                    before = before_state.get(key)
                    if before is None:  # created by this step: as a fresh optimizer has it
                        before = torch.zeros_like(value)
                    value.copy_(torch.where(flag_on(value.device), before, value))
        self._params, self._state = [], []  # the copies are freed with the step


def fused_step(optimizer: Any, original: Any, flag: Any, args: Any, kwargs: Any) -> Any:
    """Call a fused optimizer's step with the guard's flag as its ``found_inf``."""
    previous = getattr(optimizer, "found_inf", None)
    if previous is not None:  # GradScaler's own flag is honoured as well
        flag = any_flag([flag, previous], flag.device)
    optimizer.found_inf = flag.float()
    had_scale = hasattr(optimizer, "grad_scale")
    if not had_scale:
        optimizer.grad_scale = None
    try:
        return original(*args, **kwargs)
    finally:
        if previous is not None:
            optimizer.found_inf = previous
        else:
            del optimizer.found_inf
        if not had_scale:
            del optimizer.grad_scale


class HostFlag:
    """A device flag's copy in host memory, readable once the copy is done (no stall later)."""

    def __init__(self, flag: Any) -> None:
        import torch

        self._event = None
        if flag.device.type == "cpu":
            self._host = flag.clone()
            return
        self._host = flag.to("cpu", non_blocking=True)
        try:
            self._event = torch.Event(flag.device)
            self._event.record()
        except (AttributeError, RuntimeError, TypeError):
            self._event = None

    def read(self) -> bool:
        if self._event is not None:
            self._event.synchronize()  # a step old: done already, in practice
        return bool(self._host)
