"""The default torch checkpoint and a resume that reproduces losses bit for bit."""

import hashlib
import os
import random

import pytest

import brakeline

torch = pytest.importorskip("torch")
numpy = pytest.importorskip("numpy")


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)
        )

    def forward(self, x):
        return self.layers(x)


def _dataset():
    generator = torch.Generator().manual_seed(7)
    inputs = torch.randn(28, 4, generator=generator)
    return torch.utils.data.TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))


def _build(seed):
    torch.manual_seed(seed)
    model = TinyNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.7)
    # shuffle draws its order from the global torch generator: the resume must rebuild it
    loader = torch.utils.data.DataLoader(_dataset(), batch_size=4, shuffle=True)
    return model, optimizer, scheduler, loader


def _train(run, model, optimizer, scheduler, loader, start, stop, losses):
    step = start
    while step < stop:
        for inputs, targets in loader:
            # Python and NumPy randomness in the loop too, so their states must be restored.
            noise = random.random() * 1e-3 + float(numpy.random.rand()) * 1e-3
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(inputs) + noise, targets)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            losses.append(loss.item())
            run.step_boundary(step)
            if step == stop:
                return


def _seed_all(seed):
    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)


def test_resume_reproduces_the_uninterrupted_run_bit_for_bit(make_run):
    # 7 batches per epoch: step 20 is mid-epoch (epoch 2, batch 6), the hard case.
    _seed_all(1)
    straight = make_run(job="straight")
    model, optimizer, scheduler, loader = _build(0)
    straight.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    expected: list[float] = []
    _train(straight, model, optimizer, scheduler, straight.wrap_loader(loader), 0, 40, expected)

    _seed_all(1)
    first = make_run(job="interrupted")
    model, optimizer, scheduler, loader = _build(0)
    first.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    first_losses: list[float] = []
    _train(first, model, optimizer, scheduler, first.wrap_loader(loader), 0, 20, first_losses)
    saved = first.checkpoint(20)
    with open(saved.path, "rb") as handle:
        assert saved.sha256 == hashlib.sha256(handle.read()).hexdigest()

    # A fresh process in all but name: other seeds, other weights, new objects.
    _seed_all(999)
    resumed = make_run(job="resumed")
    model, optimizer, scheduler, loader = _build(123)
    wrapped = resumed.wrap_loader(loader)
    state = brakeline.restore(
        saved.path,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        loader=wrapped,
        expected_sha256=saved.sha256,
    )
    assert state.step == 20 and state.epoch == 2
    assert state.data_position["batch_in_epoch"] == 6
    resumed_losses: list[float] = []
    _train(resumed, model, optimizer, scheduler, wrapped, state.step, 40, resumed_losses)

    assert first_losses == expected[:20]
    assert resumed_losses == expected[20:]  # exact float equality, not approx


def test_restore_refuses_a_corrupted_checkpoint(make_run, tmp_path):
    run = make_run()
    model = torch.nn.Linear(2, 2)
    run.watch(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    saved = run.checkpoint(3)
    with open(saved.path, "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        last = handle.read(1)
        handle.seek(-1, os.SEEK_END)
        handle.write(bytes([last[0] ^ 0xFF]))  # flip one byte
    with pytest.raises(ValueError, match="sha256"):
        brakeline.restore(saved.path, model=model, expected_sha256=saved.sha256)


def test_default_checkpoint_holds_model_optimizer_scheduler_rng_seeds_and_position(make_run):
    run = make_run()
    run.seed(42)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    loader = run.wrap_loader([1, 2, 3])
    next(iter(loader))
    state = torch.load(run.checkpoint(1).path, weights_only=True)
    assert set(state) >= {"models", "optimizers", "schedulers", "rng", "seeds", "data_position"}
    assert set(state["rng"]) >= {"python", "numpy", "torch_cpu"}
    assert state["seeds"] == {"python": 42, "numpy": 42, "torch": 42}
    assert state["data_position"]["batch_in_epoch"] == 1


def test_checkpoint_without_anything_registered_says_what_to_do(make_run):
    with pytest.raises(RuntimeError, match="run.watch"):
        make_run().checkpoint(1)


def test_restore_without_a_loader_puts_the_random_state_back_at_once(make_run):
    run = make_run()
    model = torch.nn.Linear(2, 2)
    run.watch(model=model)
    random.seed(5)
    saved = run.checkpoint(1)
    expected = (random.random(), float(numpy.random.rand()), torch.rand(1).item())
    random.seed(77)
    brakeline.restore(saved.path, model=torch.nn.Linear(2, 2))
    assert (random.random(), float(numpy.random.rand()), torch.rand(1).item()) == expected
