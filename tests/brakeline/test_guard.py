"""The step guard keeps NaN/±Inf out of the weights; roll back restores in place; custom
handlers compose with the built-in behaviour. Real torch on the CPU, no console (the recording
transport stands in for the network)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import brakeline  # noqa: E402

POISON = {
    "nan_loss": lambda loss, model: loss * float("nan"),
    "inf_loss": lambda loss, model: loss + float("inf"),
    "minus_inf_loss": lambda loss, model: loss - float("inf"),
}


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    generator = torch.Generator().manual_seed(seed)
    data = torch.randn(256, 4, generator=generator)
    target = data.sum(dim=1, keepdim=True).sin()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(data, target), batch_size=16, shuffle=True
    )
    return model, optimizer, scheduler, loader


def _state(model, optimizer):
    return [p.detach().clone() for p in model.parameters()], optimizer.state_dict()


def _train(run, model, optimizer, scheduler, loader, steps, fault=None, at=None, guard_loss=True):
    """The loop docs/sdk.md shows; ``fault`` poisons the loss or a gradient at step ``at``."""
    losses = {}
    wrapped = run.wrap_loader(loader) if run is not None else loader
    step = run.step if run is not None else 0
    for inputs, target in wrapped:
        step = (run.step if run is not None else step) + 1
        if step > steps:
            break
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        if fault in POISON and step == at:
            loss = POISON[fault](loss, model)
        if run is not None and guard_loss:
            run.guard(loss)
        optimizer.zero_grad()
        loss.backward()
        if fault in ("nan_grad", "inf_grad") and step == at:
            next(model.parameters()).grad[0, 0] = float("nan" if fault == "nan_grad" else "inf")
        optimizer.step()
        scheduler.step()
        losses[step] = loss.item()
        if run is not None:
            run.log({"loss": loss}, step=step)
            run.step_boundary(step)
    return losses


@pytest.mark.parametrize(
    "fault", ["nan_loss", "inf_loss", "minus_inf_loss", "nan_grad", "inf_grad"]
)
def test_a_non_finite_step_never_reaches_the_weights_or_the_schedule(make_run, fault):
    model, optimizer, scheduler, loader = _setup()
    run = make_run(guard_hold_seconds=0.0)
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    _train(run, model, optimizer, scheduler, loader, steps=4)
    weights, moments = _state(model, optimizer)
    lr = scheduler.get_last_lr()
    _train(run, model, optimizer, scheduler, loader, steps=5, fault=fault, at=5)
    after, after_moments = _state(model, optimizer)
    assert all(torch.equal(a, b) for a, b in zip(weights, after, strict=True))
    assert after_moments["state"][0]["step"] == moments["state"][0]["step"]  # Adam's count
    assert scheduler.get_last_lr() == lr
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert run._guard.skipped_updates == [5] and run._guard.weights_step == 4


def test_a_clean_run_is_unaffected_bit_for_bit(make_run):
    plain = _setup()
    expected = _train(None, *plain, steps=12)
    guarded = _setup()
    run = make_run()
    run.watch(model=guarded[0], optimizer=guarded[1], scheduler=guarded[2])
    losses = _train(run, *guarded, steps=12)
    assert losses == expected
    assert all(
        torch.equal(a, b)
        for a, b in zip(plain[0].parameters(), guarded[0].parameters(), strict=True)
    )


def test_the_offending_point_is_sent_at_once_and_the_run_holds_for_the_console(make_run, transport):
    model, optimizer, scheduler, loader = _setup()
    run = make_run(guard_hold_seconds=60.0, flush_interval=30.0)
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    seen_at_decision = []
    beats: list[tuple[str, int]] = []

    def console(path, body):
        if path == "heartbeat":
            beats.append((body["status"], body["step"]))
        # The console sees the NaN point and answers with its rule's checkpoint_and_pause.
        if path == "metrics" and any(
            isinstance(p.get("value"), str) and p["name"] == "loss" for p in body["points"]
        ):
            seen_at_decision.append(run.step)
            transport.commands = [
                {"id": 7, "kind": "checkpoint_and_pause", "severity": "L3"},
                {"id": 8, "kind": "resume"},  # ends the pause, so the test goes on
            ]
        return None

    transport.responder = console
    _train(run, model, optimizer, scheduler, loader, steps=3, fault="nan_loss", at=3)
    assert seen_at_decision == [3]  # sent during the hold, not after a flush interval
    ack = next(a for a in run.acknowledgements if a["id"] == 7)
    assert ack["status"] == "succeeded" and ack["result"]["step"] == 3
    assert ack["result"]["weights_step"] == 2 and ack["result"]["reason"] == "brake"
    # While it held, it said so (a console applies its brake where every rank holds), and
    # it says so no more once the decision came.
    assert ("holding", 3) in beats
    assert run.status != "holding"


def _losses_skipping_batch_7(make_run, tmp_path):
    """The losses of an uninterrupted run that fetches the batch of step 7 and never trains
    on it."""
    model, optimizer, scheduler, base_loader = _setup()
    run = make_run(guard=False, checkpoint_dir=str(tmp_path / "a"))
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    expected = {}
    for inputs, target in run.wrap_loader(base_loader):
        step = run.step + 1
        if step > 12:
            break
        if step == 7:
            run.step_boundary(step)  # the bad batch: fetched, never trained on
            continue
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        expected[step] = loss.item()
        run.step_boundary(step)
    return expected


def test_roll_back_restores_in_place_and_skips_the_named_batch(make_run, tmp_path):
    """Uninterrupted run that skips the batch of step 7 == run poisoned at 7, rolled back to
    its checkpoint of step 4 with skip_steps=[7] (the guard off: the poison reached it)."""
    expected = _losses_skipping_batch_7(make_run, tmp_path)
    model, optimizer, scheduler, base_loader = _setup()
    run = make_run(guard=False, checkpoint_dir=str(tmp_path / "b"), guard_hold_seconds=0.0)
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    losses = {}
    wrapped = run.wrap_loader(base_loader)
    clean = None
    for inputs, target in wrapped:
        step = run.step + 1
        if step > 12:
            break
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        if (
            step == 7
            and not run._checkpoints.skip_steps
            and clean is not None
            and step not in losses
        ):
            loss = loss * float("nan")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses[step] = loss.item()
        if step == 4:
            clean = run.checkpoint(step)
        if step == 8:  # braked a step late (no guard): roll back to step 4, drop batch 7
            run.inbox.offer({"id": 1, "kind": "pause_data"})
            run.inbox.offer(
                {
                    "id": 2,
                    "kind": "resume",
                    "params": {"checkpoint": clean.path, "sha256": clean.sha256, "skip_steps": [7]},
                }
            )
        run.step_boundary(step)
    ack = next(a for a in run.acknowledgements if a["id"] == 2)
    assert ack["status"] == "succeeded", ack
    assert ack["result"]["restored_step"] == 4 and ack["result"]["sha256"] == clean.sha256
    after = {s: v for s, v in losses.items() if s >= 8}
    assert after == {s: v for s, v in expected.items() if s >= 8}


def test_a_roll_back_to_a_wrong_hash_fails_and_the_run_stays_paused(make_run, tmp_path):
    model, optimizer, scheduler, loader = _setup()
    run = make_run(checkpoint_dir=str(tmp_path))
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    saved = run.checkpoint(0)
    run.inbox.offer({"id": 1, "kind": "pause_data"})
    run.inbox.offer(
        {"id": 2, "kind": "resume", "params": {"checkpoint": saved.path, "sha256": "0" * 64}}
    )
    run.inbox.offer({"id": 3, "kind": "resume", "params": {"checkpoint": "/nonexistent/ckpt.pt"}})
    run.inbox.offer({"id": 4, "kind": "resume"})
    run.step_boundary(1)
    acks = {a["id"]: a for a in run.acknowledgements}
    assert acks[2]["status"] == "failed" and "sha256" in acks[2]["error"]
    assert acks[3]["status"] == "failed" and acks[3]["result"]["paused"] is True
    assert acks[4]["status"] == "succeeded"  # still paused until then


def test_a_custom_resume_handler_composes_with_the_built_in_resume(make_run):
    run = make_run()
    calls = []
    run.on_command("resume", lambda r, c, s: calls.append(s) or {"mine": True})
    run.inbox.offer({"id": 1, "kind": "pause_data"})
    run.inbox.offer({"id": 2, "kind": "resume"})
    run.step_boundary(5)  # returns: the pause ended
    assert calls == [5] and run.pause_state is brakeline.PauseState.RUNNING
    ack = next(a for a in run.acknowledgements if a["id"] == 2)
    assert ack["status"] == "succeeded" and ack["result"]["mine"] is True
    assert "paused_seconds" in ack["result"]


def test_a_resume_handler_that_raises_keeps_the_run_paused(make_run):
    run = make_run()

    def refuse(r, c, s):
        raise brakeline.CommandFailed("not yet: the data is still being fixed")

    run.on_command("resume", refuse)
    run.inbox.offer({"id": 1, "kind": "pause_data"})
    run.inbox.offer({"id": 2, "kind": "resume"})
    run.inbox.offer({"id": 3, "kind": "terminate"})  # how the test gets out of the hold
    run.step_boundary(5)
    acks = {a["id"]: a for a in run.acknowledgements}
    assert acks[2]["status"] == "failed" and "not yet" in acks[2]["error"]
    assert acks[3]["status"] == "succeeded"


def test_a_custom_handler_for_lower_lr_runs_before_the_built_in(make_run):
    model, optimizer, scheduler, _ = _setup()
    run = make_run()
    run.watch(model=model, optimizer=optimizer)
    run.on_command("lower_lr", lambda r, c, s: {"noted": s})
    run.inbox.offer({"id": 1, "kind": "lower_lr", "params": {"factor": 0.5}})
    run.step_boundary(2)
    ack = run.acknowledgements[-1]
    assert ack["result"]["noted"] == 2 and ack["result"]["factor"] == 0.5
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.005)


def test_a_command_left_unapplied_while_metrics_flow_is_said_loudly(make_run, caplog):
    run = make_run(unapplied_command_logs=5)
    run.inbox.offer({"id": 1, "kind": "lower_lr"})
    for step in range(1, 10):
        run.log({"loss": 1.0}, step=step)  # no step_boundary: the loop forgot it
    assert "is run.step_boundary(step) called" in caplog.text


# -- closures: the guard evaluates first, the optimizer updates after --------------------------
def _closure_for(model, inputs, target, optimizer, poison_call=None):
    calls = [0]

    def closure():
        calls[0] += 1
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        if calls[0] == poison_call:
            loss = loss * float("nan")
        loss.backward()
        return loss

    return closure, calls


def test_a_closure_computing_nan_gradients_never_reaches_the_weights(make_run):
    model, optimizer, _, loader = _setup()
    run = make_run(guard_hold_seconds=0.0)
    run.watch(model=model, optimizer=optimizer)
    inputs, target = next(iter(loader))
    closure, calls = _closure_for(model, inputs, target, optimizer, poison_call=1)
    weights, _ = _state(model, optimizer)
    loss = optimizer.step(closure)
    assert torch.isnan(loss) and calls[0] == 1  # evaluated once, by the guard
    assert all(torch.equal(a, b) for a, b in zip(weights, _state(model, optimizer)[0], strict=True))
    assert run._guard.skipped_updates == [1] and optimizer.state_dict()["state"] == {}


@pytest.mark.parametrize("poison_call", [None, 1, 3], ids=["clean", "first", "line-search"])
def test_lbfgs_evaluating_its_closure_again_is_checked_at_every_evaluation(make_run, poison_call):
    """LBFGS calls the closure several times per step (its line search moves the weights in
    between): a clean step is bit-identical to an unguarded one; a NaN in any evaluation
    leaves weights and optimizer state as they were."""

    def lbfgs_steps(run, poison_at_step):
        model, _, _, loader = _setup()
        optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
        if run is not None:
            run.watch(model=model, optimizer=optimizer)
        inputs, target = next(iter(loader))
        losses, before = [], None
        for step in (1, 2, 3):
            poison = poison_call if step == poison_at_step else None
            closure, calls = _closure_for(model, inputs, target, optimizer, poison)
            before = ((_state(model, optimizer)[0], copy.deepcopy(optimizer.state_dict())), calls)
            losses.append(float(optimizer.step(closure)))
            if run is not None:
                run.step_boundary(step)
        return model, optimizer, losses, before

    _, _, expected, _ = lbfgs_steps(None, None)
    run = make_run(guard_hold_seconds=0.0)
    model, optimizer, losses, ((weights, state), calls) = lbfgs_steps(run, 3 if poison_call else 0)
    if poison_call is None:
        assert losses == expected and run._guard.skipped_updates == []
        return
    assert calls[0] >= poison_call  # the poisoned evaluation did happen
    assert run._guard.skipped_updates == [3] and run._guard.weights_step == 2
    assert all(torch.equal(a, b) for a, b in zip(weights, _state(model, optimizer)[0], strict=True))
    assert repr(optimizer.state_dict()["state"]) == repr(state["state"])


# -- the device path (guard_device="always": the accelerators' code path, on the CPU) ----------
OPTIMIZERS = {
    "adamw-masked": lambda p: torch.optim.AdamW(p, lr=0.01),
    "adamw-fused": lambda p: torch.optim.AdamW(p, lr=0.01, fused=True),
    "sgd-momentum-masked": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "sgd-momentum-fused": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, fused=True),
}


def _device_loop(run, model, optimizer, scheduler, batches, poison_step=None, skip=()):
    """Trains on ``batches`` (step n: batches[n - 1]); steps in ``skip`` are not trained on."""
    losses, seen = {}, {}
    for step, (inputs, target) in enumerate(batches, start=1):
        if step in skip:
            continue
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        if step == poison_step:
            loss = loss * float("nan")
        if run is not None:
            run.guard(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses[step] = loss.item()
        if run is not None:
            seen[step] = (list(run._guard.skipped_updates), _state(model, optimizer)[0])
            run.step_boundary(step)
    return losses, seen


@pytest.mark.parametrize("make_optimizer", OPTIMIZERS.values(), ids=list(OPTIMIZERS))
def test_the_device_path_refuses_the_update_before_the_host_reads_the_flag(
    make_run, make_optimizer
):
    """Step 5's NaN never reaches the weights although the host learns of it only while step 6
    is computed (it then refuses step 6's update too): from step 7 on, the run is bit for bit
    a run that never trained on batches 5 and 6 (weights, moments, step counts, schedule)."""
    batches = list(_setup()[3])[:10]

    def build():
        model, *_ = _setup()
        optimizer = make_optimizer(model.parameters())
        return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 3, gamma=0.5)

    model, optimizer, scheduler = build()
    expected, _ = _device_loop(None, model, optimizer, scheduler, batches, skip=(5, 6))
    model, optimizer, scheduler = build()
    run = make_run(guard_hold_seconds=0.0, guard_device="always")
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    losses, seen = _device_loop(run, model, optimizer, scheduler, batches, poison_step=5)
    skipped_after_5, weights_after_5 = seen[5]
    assert skipped_after_5 == []  # the host did not read the flag in the step that set it ...
    assert all(torch.equal(a, b) for a, b in zip(seen[4][1], weights_after_5, strict=True))
    assert seen[6][0] == [5, 6]  # ... but one step later, before step 6's update
    assert run._guard.poisoned_updates == []
    assert {s: v for s, v in losses.items() if s >= 7} == {
        s: v for s, v in expected.items() if s >= 7
    }


def test_a_checkpoint_reads_the_pending_device_flag_for_its_label(make_run, tmp_path):
    model, optimizer, scheduler, loader = _setup()
    run = make_run(guard_hold_seconds=0.0, guard_device="always", checkpoint_dir=str(tmp_path))
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    _device_loop(run, model, optimizer, scheduler, list(loader)[:3], poison_step=3)
    assert run._guard.skipped_updates == []  # not read yet: step 4 has not begun
    saved = run.checkpoint()
    assert saved.step == 3 and saved.weights_step == 2
    assert run._guard.skipped_updates == [3]


def test_the_late_device_mode_reports_the_update_it_let_through(make_run):
    model, optimizer, scheduler, loader = _setup()
    run = make_run(guard_hold_seconds=0.0, guard_device="late")
    with pytest.raises(ValueError, match="guard_device"):
        make_run(guard_device="sometimes")
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    _device_loop(run, model, optimizer, scheduler, list(loader)[:4], poison_step=2)
    # "late" on the CPU: the flag lives in host memory, read at once (nothing lets it by).
    assert run._guard.skipped_updates == [2] and run._guard.poisoned_updates == []


def test_the_guard_counts_non_finite_gradients_for_a_watched_cpu_model(make_run, transport):
    """On the CPU the guard's own scan feeds ``nonfinite.grad``: no gradient hook scans the
    gradients a second time each step."""
    model, optimizer, scheduler, loader = _setup()
    run = make_run(guard_hold_seconds=0.0)
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    counter = run._nonfinite.counters[0]
    assert len(counter._handles) == 1  # the forward hook (losses) only
    _train(run, model, optimizer, scheduler, loader, steps=3, fault="nan_grad", at=2)
    run.flush(5.0)
    counts = {p["step"]: p["value"] for p in transport.points() if p["name"] == "nonfinite.grad"}
    assert counts[1] == 0 and counts[2] >= 1 and counts[3] == 0


def test_an_optimizer_marked_as_re_evaluating_is_put_back_else_reported(make_run):
    """A sharpness-aware step: it moves the weights, evaluates the closure again, updates."""

    class SharpnessAware(torch.optim.SGD):
        def step(self, closure):
            closure()
            with torch.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        p.add_(0.01 * p.grad.sign())
            closure()
            return super().step()

    for marked in (True, False):
        model, _, _, loader = _setup()
        optimizer = SharpnessAware(model.parameters(), lr=0.1)
        optimizer.brakeline_reevaluates = marked
        run = make_run(guard_hold_seconds=0.0)
        run.watch(model=model, optimizer=optimizer)
        inputs, target = next(iter(loader))
        closure, calls = _closure_for(model, inputs, target, optimizer, poison_call=2)
        weights, _ = _state(model, optimizer)
        optimizer.step(closure)
        run.step_boundary(1)
        after = _state(model, optimizer)[0]
        same = all(torch.equal(a, b) for a, b in zip(weights, after, strict=True))
        assert calls[0] == 2 and same is marked
        guard = run._guard
        assert (guard.skipped_updates, guard.poisoned_updates) == (
            ([1], []) if marked else ([], [1])
        )


def test_a_fused_optimizer_stepped_with_a_closure_takes_the_flag_as_found_inf(
    make_run, monkeypatch
):
    """The device path with a closure (Lightning's) and a fused optimizer: no mask copies."""
    from brakeline import _guard_device

    model, _, _, loader = _setup()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    run = make_run(guard_hold_seconds=0.0, guard_device="always")
    run.watch(model=model, optimizer=optimizer)
    masks = []
    original = _guard_device.DeviceMask.__init__
    monkeypatch.setattr(
        _guard_device.DeviceMask, "__init__", lambda self, *a: masks.append(a) or original(self, *a)
    )
    inputs, target = next(iter(loader))
    weights, _ = _state(model, optimizer)
    optimizer.step(_closure_for(model, inputs, target, optimizer, poison_call=1)[0])
    assert masks == []
    assert all(torch.equal(a, b) for a, b in zip(weights, _state(model, optimizer)[0], strict=True))
    run.checkpoint()  # reads the pending flag
    assert run._guard.skipped_updates == [1]
