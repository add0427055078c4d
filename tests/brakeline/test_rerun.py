"""Re-run to attribute (brakeline._attribute): a refused step computed by a closure is evaluated
once more from the unchanged pre-step state, on the same batch with the same generators; a
non-finite value that comes back is the data's, one that does not is a transient fault. Real
torch on the CPU; the recording transport stands in for the console."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

BATCH = 16


def _setup(dropout: float = 0.0, norm: bool = False):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 8)]
    if norm:
        layers.append(torch.nn.BatchNorm1d(8))
    layers += [torch.nn.Tanh(), torch.nn.Dropout(dropout), torch.nn.Linear(8, 1)]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = torch.randn(BATCH, 4, generator=torch.Generator().manual_seed(1))
    return model, optimizer, inputs, inputs.sum(dim=1, keepdim=True).sin()


def _closure(model, optimizer, inputs, target, calls: list[float]):
    """PyTorch's closure: clear the gradients, compute the loss on the batch, back-propagate."""

    def closure():
        optimizer.zero_grad()
        calls.append(torch.rand(()).item())  # what the generators give this evaluation
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        loss.backward()
        return loss

    return closure


def _once_nan_gradient(parameter):
    """A gradient corrupted once, on its way (the first backward through ``parameter``)."""
    fired: list[bool] = []

    def corrupt(grad):
        if fired:
            return grad
        fired.append(True)
        grad = grad.clone()
        grad.view(-1)[0] = math.nan
        return grad

    return parameter.register_hook(corrupt)


def _weights(model):
    return [p.detach().clone() for p in model.parameters()]


def _unchanged(model, weights) -> bool:
    return all(torch.equal(a, b) for a, b in zip(weights, _weights(model), strict=True))


def test_a_batch_that_gives_nan_every_time_is_attributed_to_the_data(make_run):
    model, optimizer, inputs, target = _setup()
    run = make_run(guard_hold_seconds=0.0, rerun_nonfinite=True)
    run.watch(model=model, optimizer=optimizer)
    weights, calls = _weights(model), []
    inputs = inputs.clone()
    inputs[3, 1] = math.nan  # the poisoned sample: every evaluation meets it
    loss = optimizer.step(_closure(model, optimizer, inputs, target, calls))
    assert torch.isnan(loss) and len(calls) == 2  # evaluated, then re-run once
    finding = run._guard.rerun.latest
    assert finding is not None and (finding.step, finding.attribution) == (1, "data")
    assert _unchanged(model, weights) and run._guard.skipped_updates == [1]


def test_a_one_off_nan_in_a_gradient_is_attributed_to_the_node(make_run):
    model, optimizer, inputs, target = _setup(dropout=0.3)
    run = make_run(guard_hold_seconds=0.0, rerun_nonfinite=True)
    run.watch(model=model, optimizer=optimizer)
    weights, calls = _weights(model), []
    hook = _once_nan_gradient(model[0].weight)
    loss = optimizer.step(_closure(model, optimizer, inputs, target, calls))
    hook.remove()
    finding = run._guard.rerun.latest
    assert finding is not None and (finding.step, finding.attribution) == (1, "transient")
    # The same generators: the re-run drew what the first evaluation drew (same dropout).
    assert len(calls) == 2 and calls[0] == calls[1]
    # The update stays refused: the guard's word is the first evaluation's.
    assert math.isfinite(loss.item()) and _unchanged(model, weights)
    assert run._guard.skipped_updates == [1]


def test_the_re_run_leaves_the_generators_and_buffers_as_the_first_evaluation_did(make_run):
    model, optimizer, inputs, target = _setup(dropout=0.3, norm=True)
    run = make_run(guard_hold_seconds=0.0, rerun_nonfinite=True)
    run.watch(model=model, optimizer=optimizer)
    calls: list[float] = []
    closure = _closure(model, optimizer, inputs, target, calls)
    state = torch.get_rng_state()
    closure()  # the reference: one evaluation, as a step without a re-run makes
    expected_rng, expected_buffers = torch.get_rng_state(), [b.clone() for b in model.buffers()]
    fresh = _setup(dropout=0.3, norm=True)[0]  # (seeds the generators: restored below)
    for buffer, before in zip(model.buffers(), fresh.buffers(), strict=True):
        buffer.copy_(before)
    torch.set_rng_state(state)
    hook = _once_nan_gradient(model[0].weight)
    optimizer.step(closure)
    hook.remove()
    assert run._guard.rerun.latest.attribution == "transient" and len(calls) == 3
    assert torch.equal(torch.get_rng_state(), expected_rng)
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), expected_buffers, strict=True))


def test_without_the_setting_the_closure_runs_once_and_nothing_is_attributed(make_run):
    model, optimizer, inputs, target = _setup()
    run = make_run(guard_hold_seconds=0.0)
    run.watch(model=model, optimizer=optimizer)
    calls: list[float] = []
    optimizer.step(_closure(model, optimizer, inputs * math.nan, target, calls))
    assert len(calls) == 1 and run._guard.rerun.latest is None
    assert run._guard.skipped_updates == [1]


def test_a_finite_step_is_never_re_run(make_run):
    model, optimizer, inputs, target = _setup()
    run = make_run(guard_hold_seconds=0.0, rerun_nonfinite=True)
    run.watch(model=model, optimizer=optimizer)
    calls: list[float] = []
    optimizer.step(_closure(model, optimizer, inputs, target, calls))
    assert len(calls) == 1 and run._guard.rerun.latest is None
    assert run._guard.weights_step == 1


def test_a_re_run_that_raises_concludes_nothing_and_training_goes_on(make_run):
    model, optimizer, inputs, target = _setup()
    run = make_run(guard_hold_seconds=0.0, rerun_nonfinite=True)
    run.watch(model=model, optimizer=optimizer)
    calls: list[float] = []
    inner = _closure(model, optimizer, inputs * math.nan, target, calls)

    def closure():
        if calls:
            raise RuntimeError("the batch is gone")
        return inner()

    weights = _weights(model)
    assert torch.isnan(optimizer.step(closure))
    assert run._guard.rerun.latest is None and _unchanged(model, weights)


@pytest.mark.parametrize(("poison", "attribution"), [("batch", "data"), ("gradient", "transient")])
def test_on_the_device_path_the_refused_step_is_re_run_when_its_flag_is_read(
    make_run, poison, attribution
):
    """guard_device="always": the accelerator's code path on the CPU. The flag of step 1 is
    read at step 2's optimizer.step, before step 2's closure: the mask has put the weights of
    step 1 back, so step 1's closure is re-run from them."""
    model, optimizer, inputs, target = _setup(dropout=0.3)
    run = make_run(guard_hold_seconds=0.0, rerun_nonfinite=True, guard_device="always")
    run.watch(model=model, optimizer=optimizer)
    weights, calls = _weights(model), []
    first = inputs * math.nan if poison == "batch" else inputs
    hook = _once_nan_gradient(model[0].weight) if poison == "gradient" else None
    optimizer.step(_closure(model, optimizer, first, target, calls))
    if hook is not None:
        hook.remove()
    run.step_boundary(1)
    assert run._guard.rerun.latest is None and len(calls) == 1  # not read yet: no host stall
    optimizer.step(_closure(model, optimizer, inputs, target, calls))
    finding = run._guard.rerun.latest
    assert finding is not None and (finding.step, finding.attribution) == (1, attribution)
    assert len(calls) == 3 and calls[1] == calls[0]  # re-run with step 1's generators
    # Step 2 is refused with it (the host learnt of the trip only now): nothing moved.
    assert _unchanged(model, weights) and run._guard.skipped_updates == [1, 2]


def test_a_refused_device_step_is_not_re_run_over_a_later_backwards_gradients(make_run):
    model, optimizer, inputs, target = _setup()
    run = make_run(guard_hold_seconds=0.0, rerun_nonfinite=True, guard_device="always")
    run.watch(model=model, optimizer=optimizer)
    calls: list[float] = []
    optimizer.step(_closure(model, optimizer, inputs * math.nan, target, calls))
    run.step_boundary(1)
    _closure(model, optimizer, inputs, target, calls)()  # a plain backward, then step()
    optimizer.step()
    assert run._guard.rerun.latest is None and len(calls) == 2


def test_a_closure_that_guards_its_own_loss_leaves_no_flag_for_the_next_step(make_run):
    model, optimizer, inputs, target = _setup()
    run = make_run(guard_hold_seconds=0.0, rerun_nonfinite=True)
    run.watch(model=model, optimizer=optimizer)
    calls: list[float] = []

    def guarded(batch):
        inner = _closure(model, optimizer, batch, target, calls)
        return lambda: run.guard(inner())

    optimizer.step(guarded(inputs * math.nan))
    run.step_boundary(1)
    assert run._guard.rerun.latest.attribution == "data"
    optimizer.step(guarded(inputs))  # a clean step: its update goes through
    assert run._guard.skipped_updates == [1] and run._guard.weights_step == 2


def test_the_brakes_acknowledgement_carries_the_finding_once(make_run, transport):
    model, optimizer, inputs, target = _setup()
    run = make_run(guard_hold_seconds=60.0, rerun_nonfinite=True)
    run.watch(model=model, optimizer=optimizer)

    def console(path, body):
        # The console sees the refused update and answers with its rule's brake.
        if path == "metrics" and any(p["name"] == "guard.skipped_updates" for p in body["points"]):
            transport.commands = [
                {"id": 7, "kind": "checkpoint_and_pause", "severity": "L3"},
                {"id": 8, "kind": "resume"},
            ]
            transport.responder = None
        return None

    transport.responder = console
    for step in (1, 2):
        batch = inputs * math.nan if step == 2 else inputs
        optimizer.step(_closure(model, optimizer, batch, target, []))
        run.step_boundary(step)
    ack = next(a for a in run.acknowledgements if a["id"] == 7)
    assert ack["result"]["rerun"] == {"step": 2, "attribution": "data"}
    assert ack["result"]["weights_step"] == 1
    # Said once: a later checkpoint of the same run does not repeat it.
    assert run.checkpoint(2, reason="brake").rerun is None
