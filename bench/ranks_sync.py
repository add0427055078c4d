"""Every rank holds at the same step, at random: repeated real torchrun jobs (gloo on CPU)
against the real console (Daphne, a Celery worker with the default rule pack, PostgreSQL,
Redis). Each run draws its world size (2 or 4), the step and rank of a one-rank NaN, the
ranks without a websocket (none, some or all), and a per-step sleep jitter; the rules brake
(checkpoint_and_pause with an apply_at_step) — or, in half the runs, a person pauses the job
while every rank trains and the ranks without a websocket ask the console only every
0.5-1.5 s — then the bench checks that every rank acknowledged and held at one step, and
resumes. Prints "N of N held at the same step".

    DATABASE_URL=… REDIS_URL=… python bench/ranks_sync.py --runs 100   (from bench/)

``--margin`` is the console's COMMAND_APPLY_MARGIN_SECONDS for the run; a small one (default
0.3 s) makes the command reach some ranks after the others already are at its step, which
the ranks' agreement must then absorb (every rank waits for it at that boundary).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# A queue and key prefix of our own, before Django reads its settings (see bench/evaluation.py).
os.environ.setdefault("BRAKELINE_CELERY_QUEUE", "brakeline-bench-ranks")
os.environ.setdefault("BRAKELINE_CHANNEL_PREFIX", "brakeline-bench-ranks")

from _stack import ROOT, daphne, median, set_up_django, start_worker  # noqa: E402

SCRIPT = ROOT / "tests" / "brakeline" / "scripts" / "train_rank_sync.py"


def draw(rng: random.Random, scenario: str) -> dict:
    ranks = rng.choice([2, 4])
    manual = scenario == "manual" or (scenario == "mixed" and rng.random() < 0.5)
    without = [r for r in range(ranks) if rng.random() < 0.5]
    if rng.random() < 0.2:
        without = list(range(ranks))  # websocket off everywhere
    return {
        "ranks": ranks,
        # A person's pause while every rank trains (no guard hold to line the ranks up), or
        # the rules' brake after a one-rank NaN.
        "nan_at": 0 if manual else rng.randint(5, 25),
        "pause_at": rng.randint(10, 40) if manual else 0,
        # Ranks without a websocket then ask the console only every 0.5-1.5 s: the command
        # often reaches them after the others are at its step.
        "slow_poll": round(rng.uniform(0.5, 1.5), 2) if manual else 0.0,
        "nan_rank": rng.randrange(ranks),
        "without_websocket": without,
        "jitter": round(rng.uniform(0.0, 0.02), 4),
        "seed": rng.randrange(10**6),
    }


def environment(url: str, token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRAKELINE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "sdk"), env.get("PYTHONPATH")]))
    env.update(OMP_NUM_THREADS="1", BRAKELINE_URL=url, BRAKELINE_TOKEN=token)
    return env


def wait_for(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return None


def torchrun_command(draw_: dict, work: Path) -> list[str]:
    """One drawn job: its ranks, the NaN's step and rank, the ranks without a websocket."""
    options = {
        "--nan-at": draw_["nan_at"],
        "--nan-rank": draw_["nan_rank"],
        "--no-websocket": ",".join(map(str, draw_["without_websocket"])),
        "--jitter": draw_["jitter"],
        "--seed": draw_["seed"],
        "--slow-poll": draw_["slow_poll"],
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", str(draw_["ranks"]), str(SCRIPT), str(work)]
    for option, value in options.items():
        command += [option, str(value)]
    return command


def one_run(url: str, draw_: dict, work: Path) -> tuple[bool, str]:
    from breakers.control.commands import issue_command
    from breakers.models import Command, CommandAck, CommandKind, CommandStatus
    from incidents.jobs import create_job

    created = create_job("bench", f"ranks-{time.time_ns()}")
    job_id = created.job.pk
    command = torchrun_command(draw_, work)
    with open(work / "torchrun.log", "wb") as log:
        process = subprocess.Popen(
            command, cwd=work, env=environment(url, created.raw_token), stdout=log, stderr=log
        )
    try:
        if draw_["pause_at"] and not pause_by_hand(job_id, draw_["pause_at"]):
            return False, "the job never reached the step of the pause"
        brake = wait_for(
            lambda: Command.objects.filter(
                job_id=job_id,
                kind=CommandKind.CHECKPOINT_AND_PAUSE,
                status__in=[CommandStatus.SUCCEEDED, CommandStatus.FAILED],
            ).first(),
            180,
        )
        if brake is None:
            return False, "no acknowledged brake within 180 s"
        steps = dict(CommandAck.objects.filter(command=brake).values_list("rank", "step"))
        if brake.status != CommandStatus.SUCCEEDED:
            return False, f"brake failed: {brake.error} ({steps})"
        issue_command(job_id, CommandKind.RESUME, reason="bench: resume")
        if process.wait(timeout=180) != 0:
            return False, f"torchrun exited with {process.returncode}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reports = [json.loads((work / f"rank-{r}.json").read_text()) for r in range(draw_["ranks"])]
    held = {tuple(r["held_at"]) for r in reports}
    last = {r["last_step"] for r in reports}
    # One step for all: every rank acked, held and stopped at one and the same step (the
    # apply_at_step itself, or a later one the ranks agreed on when it reached them late).
    acked = set(steps.values())
    same = len(acked) == 1 and held == {tuple(acked)} and last == acked
    where = "at apply_at_step" if acked == {brake.apply_at_step} else "later, agreed"
    return same, f"apply_at_step {brake.apply_at_step} ({where}), acks {steps}, held {held}"


def pause_by_hand(job_id: int, step: int) -> bool:
    """The pause button, once the console knows the ranks and they are past ``step``."""
    from breakers.control.commands import issue_command
    from incidents.models import Job

    def ready() -> bool:
        job = Job.objects.get(pk=job_id)
        return bool(job.world_size and (job.current_step or 0) >= step)

    if not wait_for(ready, 180):
        return False
    issue_command(job_id, "checkpoint_and_pause", reason="bench: the pause button")
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--margin", type=float, default=0.3)
    parser.add_argument("--scenario", choices=["nan", "manual", "mixed"], default="mixed")
    args = parser.parse_args()
    os.environ["BRAKELINE_COMMAND_APPLY_MARGIN_SECONDS"] = str(args.margin)
    set_up_django()
    from breakers.detection.rules import install_default_pack
    from config.celery import app
    from incidents.models import Job

    install_default_pack()
    app.control.purge()
    # Earlier runs' jobs must not weigh on every tick (a bench-only cleanup, as bench/brake.py).
    Job.objects.filter(team__name="bench").exclude(status="terminated").update(
        status="terminated", heartbeat_deadline=None
    )
    rng = random.Random(args.seed)
    held, waited, exact, durations = 0, 0, 0, []
    with tempfile.TemporaryDirectory() as scratch, daphne() as url:
        worker = start_worker()
        try:
            for index in range(args.runs):
                draw_ = draw(rng, args.scenario)
                work = Path(scratch) / f"run-{index}"
                work.mkdir()
                started = time.monotonic()
                ok, detail = one_run(url, draw_, work)
                durations.append(time.monotonic() - started)
                held += ok
                log = (work / "torchrun.log").read_text(errors="replace")
                waited += "waiting for it here" in log
                exact += "(at apply_at_step)" in detail
                print(f"run {index + 1}: {'same step' if ok else 'NOT THE SAME'} {draw_} {detail}")
                sys.stdout.flush()
        finally:
            worker.terminate()
            worker.wait(timeout=20)
    print(
        f"{held} of {args.runs} held at the same step (margin {args.margin} s, "
        f"scenario {args.scenario}; {exact} exactly at apply_at_step; {waited} runs had a "
        f"rank wait at the agreed boundary for a command it had not received; "
        f"median {median(durations):.1f} s per run)"
    )


if __name__ == "__main__":
    main()
