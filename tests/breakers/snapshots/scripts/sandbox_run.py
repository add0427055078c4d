"""A run inside a sandbox: a tiny torch model, a loader with workers, one checkpoint.

python sandbox_run.py CHECKPOINT_DIR WORKERS [--no-seed]
"""

import sys

import torch

import brakeline

folder, workers = sys.argv[1], int(sys.argv[2])
run = brakeline.init(checkpoint_dir=folder, heartbeat_interval=0.5, flush_interval=0.1)
if "--no-seed" not in sys.argv:
    run.seed(3)
model = torch.nn.Linear(2, 1)
run.watch(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
run.wrap_loader(torch.utils.data.DataLoader(list(range(8)), batch_size=2, num_workers=workers))
run.checkpoint(0)
run.finish()
