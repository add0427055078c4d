"""Re-run to attribute: what ``rerun_nonfinite=True`` costs a guarded training step.

    python bench/rerun_overhead.py      (torch needed; no console: the runs are offline)

The MLP of bench/sdk_overhead.py on the CPU, stepped with a closure (``optimizer.step(closure)``)
under the step guard, in blocks of --steps steps. Blocks alternate, --pairs times: the re-run
off (the baseline), then on, so both sides of a pair see the same machine load. A finite step
with the re-run on pays one copy of each random generator's state (Python's, NumPy's when it
is imported, torch's); nothing is re-run. A block's figure is its median step time in the
training thread's CPU time; a pair's overhead is on / off - 1; the result is the median over
the pairs. Then the refused step itself: a NaN batch, guarded, with and without its re-run
(the median of --trips each): the re-run costs about one more evaluation of the closure.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time

from sdk_overhead import build

import brakeline


def closure_for(model, optimizer, inputs, labels):
    import torch

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        return loss

    return closure


def run_for(rerun: bool, folder: str) -> brakeline.Run:
    return brakeline.init(
        job=f"bench-rerun-{rerun}",
        url="",
        token="",
        spill_dir=folder,
        checkpoint_dir=folder,
        send_snapshots=False,
        guard_hold_seconds=0.0,
        rerun_nonfinite=rerun,
    )


def median_step(run, model, optimizer, inputs, labels, steps: int) -> float:
    times = []
    closure = closure_for(model, optimizer, inputs, labels)
    for _ in range(steps):
        began = time.thread_time()
        optimizer.step(closure)
        run.step_boundary()
        times.append(time.thread_time() - began)
    return statistics.median(times)


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--trips", type=int, default=15)
    options = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        runs, setups = {}, {}
        for rerun in (False, True):
            model, optimizer, inputs, labels = build()
            setups[rerun] = (model, optimizer, inputs, labels)
            runs[rerun] = run_for(rerun, folder)
            runs[rerun].watch(model=setups[rerun][0], optimizer=setups[rerun][1])
        ratios, medians = [], {False: [], True: []}
        for _ in range(options.pairs):
            for rerun in (False, True):
                medians[rerun].append(median_step(runs[rerun], *setups[rerun], steps=options.steps))
            ratios.append(medians[True][-1] / medians[False][-1] - 1)
        trips = {}
        for rerun in (False, True):
            model, optimizer, inputs, labels = setups[rerun]
            nan_batch = inputs * math.nan
            trips[rerun] = statistics.median(
                median_step(runs[rerun], model, optimizer, nan_batch, labels, 1)
                for _ in range(options.trips)
            )
        for run in runs.values():
            run.finish()
    off, on = statistics.median(medians[False]), statistics.median(medians[True])
    print(f"finite step, re-run off: median {off * 1e3:.3f} ms (training-thread CPU)")
    print(f"finite step, re-run on:  median {on * 1e3:.3f} ms")
    print(f"overhead of the re-run setting: median {statistics.median(ratios) * 100:+.2f} %")
    print(f"refused step without re-run: {trips[False] * 1e3:.3f} ms")
    print(f"refused step with re-run:    {trips[True] * 1e3:.3f} ms")
    print(f"ratio: {trips[True] / trips[False]:.2f}x (one more evaluation of the closure)")


if __name__ == "__main__":
    main()
