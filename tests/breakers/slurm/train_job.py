"""A tiny training loop that sbatch runs in the Slurm tests, talking to the console with the SDK.

Environment: TRAIN_DIR (checkpoint and marker files), TRAIN_HANG_AT (stop stepping at this
step, as a hung collective would: no more heartbeats), TRAIN_XID_AT (log a GPU XID error at
this step: an L4 hardware error), TRAIN_STEPS. It checkpoints every 10 steps and on USR1 (the
scheduler's "you are about to be cancelled"), and resumes from its checkpoint when Slurm
restarts it (a requeue).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import brakeline

out = Path(os.environ["TRAIN_DIR"])
checkpoint = out / "checkpoint.json"
hang_at = int(os.environ.get("TRAIN_HANG_AT", "0"))
xid_at = int(os.environ.get("TRAIN_XID_AT", "0"))
steps = int(os.environ.get("TRAIN_STEPS", "100000"))
restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
state = {"step": 0}


def write(path: Path, body: dict) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(body))
    os.replace(partial, path)  # a kill (or a reader) mid-write never sees half a file


def save(why: str) -> None:
    body = {"step": state["step"], "why": why, "restart": restart}
    write(checkpoint, {**body, "slurm_job_id": os.environ.get("SLURM_JOB_ID")})


def on_usr1(signum, frame) -> None:
    save("USR1")


signal.signal(signal.SIGUSR1, on_usr1)
start = json.loads(checkpoint.read_text())["step"] if checkpoint.exists() else 0
write(out / f"started-{restart}.json", {"resumed_from": start})

run = brakeline.init(job="slurm-test", heartbeat_interval=0.2, flush_interval=0.05)
for step in range(start + 1, steps + 1):
    state["step"] = step
    values = {"loss": 2.0 + (step % 7) * 0.01}
    if step == xid_at:
        values["gpu.0.xid"] = 79.0  # "GPU has fallen off the bus"
    run.log(values, step=step)
    run.step_boundary(step)
    if step % 10 == 0:
        save("periodic")
    if step == hang_at:
        (out / "hung").write_text(str(step))
        while True:  # hung: no step, no heartbeat, no acknowledgement; only signals get in
            time.sleep(0.05)
    time.sleep(0.05)
run.finish()
