"""The step guard against the real console: poisoned optimizer steps and steps past the anomaly.

For each fault (NaN, +Inf, -Inf in the loss; NaN, Inf in one gradient element) and several
randomised steps, a real PyTorch training subprocess (bench/guard_training.py) streams through
the SDK to Daphne with a Celery worker evaluating the default rules. At the poisoned step S the
L3 rule answers checkpoint_and_pause; its acknowledgement says where the run held (``step``) and
which updates the saved weights hold (``weights_step``):

- poisoned updates = how many updates from step S on the weights hold: weights_step - (S - 1);
- steps past the anomaly = held step - S.

The same is run with the guard off, as the baseline of this run. Then a clean run with the
guard and one without are compared loss by loss (bit for bit). Prints medians and counts.
``--framework lightning`` trains through a real Lightning ``Trainer.fit`` instead of a loop.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _stack import daphne, median, set_up_django, start_worker

HERE = Path(__file__).resolve().parent
FAULTS = ("nan_loss", "inf_loss", "minus_inf_loss", "nan_grad", "inf_grad")


def train(url: str | None, token: str | None, work: Path, *args: object) -> subprocess.Popen:
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRAKELINE_")}
    if url and token:
        env.update(BRAKELINE_URL=url, BRAKELINE_TOKEN=token)
    command = [
        sys.executable,
        str(HERE / "guard_training.py"),
        "--work-dir",
        str(work),
        "--losses",
        str(work / "losses.txt"),
        *map(str, args),
    ]
    return subprocess.Popen(
        command, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def braked_once(
    url: str, scratch: Path, fault: str, at: int, guard: bool, framework: str
) -> tuple[int, int, float]:
    from breakers.control.commands import issue_command
    from breakers.models import Command
    from incidents.jobs import create_job

    created = create_job("bench", f"guard-{fault}-{time.time_ns()}")
    job_id = created.job.pk
    flags = ["--framework", framework] + ([] if guard else ["--no-guard"])
    process = train(
        url, created.raw_token, scratch / f"{job_id}", "--fault", fault, "--at", at, *flags
    )
    deadline = time.monotonic() + 120
    pause = None
    while time.monotonic() < deadline and pause is None:
        pause = Command.objects.filter(
            job_id=job_id, kind="checkpoint_and_pause", status="succeeded"
        ).first()
        time.sleep(0.05)
    if pause is None:
        process.kill()
        raise SystemExit(f"{fault} at {at}: no brake within 120 s")
    issue_command(job_id, "terminate", reason="bench done")
    process.wait(timeout=60)
    held = pause.result["step"]
    holds = pause.result.get("weights_step", held)  # no guard: the weights hold every step
    issued = pause.issued_at
    seconds = (pause.acknowledged_at - issued).total_seconds()
    return max(0, holds - (at - 1)), held - at, seconds


def clean_runs_agree(scratch: Path, framework: str) -> bool:
    runs = []
    for name, flags in (("clean-guarded", []), ("clean-unguarded", ["--no-guard"])):
        work = scratch / name
        flags = [*flags, "--framework", framework]
        train(None, None, work, "--step-seconds", 0, *flags).wait(timeout=300)
        runs.append((work / "losses.txt").read_text())
    return runs[0] == runs[1] and len(runs[0].splitlines()) == 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=4, help="per fault and mode")
    parser.add_argument("--framework", choices=("loop", "lightning"), default="loop")
    args = parser.parse_args()
    set_up_django()
    rng = random.Random(14)
    rows = []
    with tempfile.TemporaryDirectory() as scratch_dir, daphne() as url:
        scratch = Path(scratch_dir)
        worker = start_worker()
        try:
            time.sleep(3)
            for fault in FAULTS:
                for guard in (True, False):
                    for _ in range(args.tries):
                        at = rng.randint(40, 120)
                        braked = braked_once(url, scratch, fault, at, guard, args.framework)
                        rows.append((fault, guard, *braked))
        finally:
            worker.terminate()
            worker.wait(timeout=20)
        agree = clean_runs_agree(scratch, args.framework)
    print(
        f"Step guard, {args.framework}, {args.tries} randomised steps per fault "
        "(CPU, real console):"
    )
    print(
        f"{'fault':<16}{'guard':<7}{'poisoned updates':>18}{'steps past':>12}{'ack s (median)':>16}"
    )
    for fault in FAULTS:
        for guard in (True, False):
            mine = [r for r in rows if r[0] == fault and r[1] == guard]
            poisoned = sum(r[2] for r in mine)
            past = sum(r[3] for r in mine)
            print(
                f"{fault:<16}{'on' if guard else 'off':<7}{poisoned:>18}{past:>12}"
                f"{median([r[4] for r in mine]):>16.3f}"
            )
    print(f"clean run with the guard == without it, bit for bit: {agree}")


if __name__ == "__main__":
    main()
