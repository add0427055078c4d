"""A small run with the SDK (no torch): train, checkpoint, or resume from that checkpoint.

    python resume_run.py train  CHECKPOINT_DIR SEED        # 10 steps, a checkpoint, exit
    python resume_run.py resume CHECKPOINT_DIR SEED [--restore-loader]

The checkpoint is a JSON file written through ``run.set_saver``: the step, the seeds and the
loader's state. ``resume`` sends the resume snapshot the console diffs against it.
"""

import json
import sys
from pathlib import Path

import brakeline
from brakeline._checkpoint import latest_checkpoint
from brakeline.snapshot import send_resume_snapshot

mode, folder, seed = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
run = brakeline.init(checkpoint_dir=str(folder), heartbeat_interval=0.5, flush_interval=0.1)
run.seed(seed)
loader = run.wrap_loader(list(range(100)))


def save(path, step):
    state = {"step": step, "seeds": run.training.seeds, "loader": loader.state_dict()}
    Path(path).write_text(json.dumps(state))


run.set_saver(save, suffix=".json")
if mode == "train":
    for step, _batch in enumerate(loader, start=1):
        run.log({"loss": 1.0 / step}, step=step)
        run.step_boundary(step)
        if step == 10:
            break
    run.checkpoint()
else:
    path = latest_checkpoint(folder, suffix=".json")
    state = json.loads(path.read_text())
    if "--restore-loader" in sys.argv:
        loader.load_state_dict(state["loader"])
    run.step = state["step"]
    send_resume_snapshot(run, path)
run.finish()
