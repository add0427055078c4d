"""lower_lr on real torch optimizers and schedulers; non-finite counting."""

import math

import pytest

torch = pytest.importorskip("torch")

from brakeline.torch import NonFiniteCounter  # noqa: E402


def lower_lr(command_id, factor):
    return {"id": command_id, "kind": "lower_lr", "params": {"factor": factor}}


def _model_and_optimizer(lr=0.1):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(
        [
            {"params": [model.weight], "lr": lr},
            {"params": [model.bias], "lr": lr * 10},
        ],
        momentum=0.9,
    )
    return model, optimizer


def _train_step(model, optimizer):
    optimizer.zero_grad()
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()


def test_lower_lr_scales_every_param_group_and_acks_the_new_lrs(make_run):
    model, optimizer = _model_and_optimizer()
    run = make_run()
    run.watch(model=model, optimizer=optimizer)
    run.inbox.offer(lower_lr(1, 0.5))
    run.step_boundary(10)
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([0.05, 0.5])
    ack = run.acknowledgements[-1]
    assert ack["status"] == "succeeded"
    assert ack["result"]["lrs"] == [pytest.approx([0.05, 0.5])]
    assert ack["result"]["step"] == 10 and ack["result"]["effective_from_step"] == 11


@pytest.mark.parametrize(
    "make_scheduler",
    [
        lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 1.0 / (1 + epoch)),
        lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
        lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10),
        lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=20),
    ],
    ids=["lambda", "step", "cosine", "onecycle"],
)
def test_a_scheduler_does_not_undo_the_lowered_lr(make_run, make_scheduler):
    model, optimizer = _model_and_optimizer()
    twin_model, twin_optimizer = _model_and_optimizer()
    scheduler, twin_scheduler = make_scheduler(optimizer), make_scheduler(twin_optimizer)
    run = make_run()
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    both = ((model, optimizer, scheduler), (twin_model, twin_optimizer, twin_scheduler))
    for step in range(3):
        for m, o, s in both:
            _train_step(m, o)
            s.step()
        run.step_boundary(step)
    run.inbox.offer(lower_lr(2, 0.25))
    run.step_boundary(3)
    for _ in range(4):
        for m, o, s in both:
            _train_step(m, o)
            s.step()
        lowered = [group["lr"] for group in optimizer.param_groups]
        untouched = [group["lr"] for group in twin_optimizer.param_groups]
        assert lowered == pytest.approx([0.25 * lr for lr in untouched])


@pytest.mark.parametrize("factor", [0, -1, 2, float("nan"), "half", True])
def test_lower_lr_refuses_a_bad_factor_and_changes_nothing(make_run, factor):
    model, optimizer = _model_and_optimizer()
    run = make_run()
    run.watch(model=model, optimizer=optimizer)
    run.inbox.offer(lower_lr(3, factor))
    run.step_boundary(1)
    assert run.acknowledgements[-1]["status"] == "failed"
    assert "factor" in run.acknowledgements[-1]["error"]
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([0.1, 1.0])


def test_counter_counts_nonfinite_gradients_and_loss_outputs():
    class ReturnsLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 1)

        def forward(self, x):
            loss = self.linear(x).sum()
            return {"loss": loss}

    model = ReturnsLoss()
    counter = NonFiniteCounter(model)
    model(torch.ones(1, 2))["loss"].backward()
    assert counter.read() == {"nonfinite.loss": 0, "nonfinite.grad": 0}
    model(torch.tensor([[math.nan, 1.0]]))["loss"].backward()
    # loss NaN; weight gradient = x, so one NaN element; bias gradient finite.
    assert counter.read() == {"nonfinite.loss": 1, "nonfinite.grad": 1}
    assert counter.read() == {"nonfinite.grad": 0}  # reset after each read
    counter.detach()
    model(torch.tensor([[math.nan, 1.0]]))["loss"].backward()
    assert counter.read() == {"nonfinite.grad": 0}


def test_every_log_carries_nonfinite_counts_of_a_watched_model(make_run, transport):
    model = torch.nn.Linear(2, 1)
    run = make_run()
    run.watch(model=model)
    model(torch.ones(1, 2)).sum().backward()
    run.log({"loss": 0.3}, step=1)
    model(torch.tensor([[math.inf, 1.0]])).sum().backward()
    run.log({"loss": torch.tensor(math.nan)}, step=2)
    run.flush(2.0)
    values = {(p["step"], p["name"]): p["value"] for p in transport.points()}
    assert values[(1, "nonfinite.grad")] == 0 and values[(1, "nonfinite.loss")] == 0
    assert values[(2, "nonfinite.grad")] >= 1
    assert values[(2, "nonfinite.loss")] == 1 and values[(2, "loss")] == "NaN"


def test_watching_a_model_twice_counts_once(make_run, transport):
    model = torch.nn.Linear(2, 1)
    run = make_run()
    run.watch(model=model)
    run.watch(model=model)
    model(torch.tensor([[math.nan, 1.0]])).sum().backward()
    run.log({"acc": 1.0}, step=1)
    run.flush(2.0)
    # One NaN element (the weight gradient is x); a second counter would report 2.
    assert {p["name"]: p["value"] for p in transport.points()}["nonfinite.grad"] == 1


def test_a_logged_tensor_keeps_its_value_when_changed_afterwards(make_run, transport):
    run = make_run()
    running = torch.tensor(1.5)
    run.log({"loss": running}, step=1)
    running += 100  # in place, before the sender thread reads it
    run.flush(2.0)
    assert [p["value"] for p in transport.points() if p["name"] == "loss"] == [1.5]
