"""The SDK's side of fault injection (sdk/brakeline/_drill.py), in-process and offline: faults
really reach the tensors, and a process that is not a drill sandbox refuses every one.

No database, no console: the command enters through the run's inbox, the same entry the
websocket and the heartbeat replies use, and is applied at the step boundary like any other.
"""

from __future__ import annotations

import errno
import math
import threading
import time

import pytest
import torch

import brakeline
from brakeline._drill import FAULTS, SANDBOX_VARIABLE

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def run(tmp_path):
    made = brakeline.init(
        job="drill-sdk",
        spill_dir=str(tmp_path / "spill"),
        checkpoint_dir=str(tmp_path / "checkpoints"),
        send_snapshots=False,
    )
    yield made
    made.finish()


def inject(run, fault: str, at_step: int, **params) -> None:
    run.inbox.offer(
        {
            "id": f"f-{fault}",
            "kind": "inject_fault",
            "params": {"fault": fault, "at_step": at_step, **params},
        }
    )


def train(run, steps: int, *faults) -> tuple[torch.nn.Module, list[float], list[list[float]]]:
    """A tiny guarded loop, the faults sent once the model is watched (they are applied at the
    boundary of step 0); returns the model, each step's loss and each step's weights."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run.watch(model=model, optimizer=optimizer)
    for fault, at_step, params in faults:
        inject(run, fault, at_step, **params)
    run.step_boundary(0)
    inputs, targets = torch.randn(8, 4), torch.randn(8, 1)
    losses, weights = [], []
    for step in range(1, steps + 1):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        run.guard(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        weights.append(model.weight.detach().flatten().tolist())
        run.step_boundary(step)
    return model, losses, weights


def ack(run, fault: str) -> dict:
    return next(a for a in run.acknowledgements if a["id"] == f"f-{fault}")


def test_an_ordinary_process_refuses_every_fault(run, monkeypatch):
    monkeypatch.delenv(SANDBOX_VARIABLE, raising=False)
    _, losses, _ = train(run, 5, ("nan_loss", 3, {}))
    refused = ack(run, "nan_loss")
    assert refused["status"] == "failed" and "not a drill sandbox" in refused["error"]
    assert all(math.isfinite(loss) for loss in losses)


def test_a_nan_in_the_loss_is_in_the_tensor_and_the_guard_keeps_it_out_of_the_weights(
    run, monkeypatch
):
    monkeypatch.setenv(SANDBOX_VARIABLE, "1")
    _, losses, weights = train(run, 5, ("nan_loss", 3, {}))
    assert ack(run, "nan_loss")["status"] == "succeeded"
    assert ack(run, "nan_loss")["result"] == {"step": 0, "fault": "nan_loss", "at_step": 3}
    assert [math.isnan(loss) for loss in losses] == [False, False, True, False, False]
    assert weights[2] == weights[1]  # the poisoned update was refused by the step guard
    assert run._guard.refused_count() == 1


def test_a_nan_in_the_gradients_leaves_the_loss_finite(run, monkeypatch):
    monkeypatch.setenv(SANDBOX_VARIABLE, "1")
    _, losses, weights = train(run, 3, ("nan_grad", 2, {}))
    assert all(math.isfinite(loss) for loss in losses)
    assert weights[1] == weights[0] and weights[2] != weights[1]
    assert run._guard.refused_count() == 1


def test_an_lr_spike_multiplies_the_learning_rate(run, monkeypatch):
    monkeypatch.setenv(SANDBOX_VARIABLE, "1")
    train(run, 3, ("lr_spike", 2, {"factor": 1000.0}))
    assert run.training.optimizers[0].param_groups[0]["lr"] == pytest.approx(100.0)


def test_a_failing_save_fails_with_the_errno_of_a_full_disk(run, monkeypatch):
    monkeypatch.setenv(SANDBOX_VARIABLE, "1")
    train(run, 3, ("checkpoint_disk_full", 2, {}))
    with pytest.raises(OSError) as raised:
        run.checkpoint(reason="manual")
    assert raised.value.errno == errno.ENOSPC


def test_heartbeat_loss_stops_stepping_until_a_command_arrives(run, monkeypatch):
    monkeypatch.setenv(SANDBOX_VARIABLE, "1")
    seen: list[tuple[int, float]] = []

    def resume_once_stalled() -> None:
        """Once the boundaries of steps 0 and 1 are counted (however slow the machine), a
        while without a step, then the command that ends the stall."""
        waited = time.monotonic() + 60
        while run._state.progress < 2 and time.monotonic() < waited:
            time.sleep(0.01)
        time.sleep(0.6)
        seen.append((run._state.progress, time.monotonic()))
        run.inbox.offer({"id": "r", "kind": "resume", "params": {}})

    threading.Thread(target=resume_once_stalled, daemon=True).start()
    train(run, 3, ("heartbeat_loss", 2, {"seconds": 30, "answer_after": 0.5}))
    [(progress, offered_at)] = seen
    assert progress == 2  # the boundaries of steps 0 and 1, nothing while stalled
    assert time.monotonic() - offered_at >= 0.5  # it went on only answer_after past the command
    assert [a["id"] for a in run.acknowledgements] == ["f-heartbeat_loss", "r"]


def test_an_unknown_fault_or_step_is_refused_by_name(run, monkeypatch):
    monkeypatch.setenv(SANDBOX_VARIABLE, "1")
    run.inbox.offer(
        {
            "id": "f-bad-step",
            "kind": "inject_fault",
            "params": {"fault": "nan_loss", "at_step": "soon"},
        }
    )
    train(run, 1, ("meteor", 2, {}))
    assert "unknown fault 'meteor'" in ack(run, "meteor")["error"]
    assert "at_step must be a whole step number" in ack(run, "bad-step")["error"]
    assert set(FAULTS) >= {"nan_loss", "heartbeat_loss", "hang", "xid", "checkpoint_disk_full"}


def test_the_sdk_notes_for_a_drill_that_the_release_hooks_ran(run, tmp_path, monkeypatch):
    """The drill's release line reads this note, whatever training script ran."""
    from brakeline._drill import RELEASE_MARKER_VARIABLE
    from brakeline._pause import PauseInfo

    marker = tmp_path / "released"
    monkeypatch.setenv(RELEASE_MARKER_VARIABLE, str(marker))
    monkeypatch.delenv(SANDBOX_VARIABLE, raising=False)
    freed = []
    run.on_release(lambda info: freed.append(info.step))
    run.on_release(lambda info: 1 / 0)  # a broken hook is not counted
    run.call_hooks("release", PauseInfo(7, "c1", "drill", None))
    assert freed == [7] and not marker.exists()  # not a sandbox: no note
    monkeypatch.setenv(SANDBOX_VARIABLE, "1")
    run.call_hooks("release", PauseInfo(9, "c2", "drill", None))
    assert marker.read_text() == "1 9\n"
