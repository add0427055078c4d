"""Brakeline client SDK: stream metrics and heartbeats, obey console commands safely.

    run = brakeline.init(job="llm-7b")          # BRAKELINE_URL / BRAKELINE_TOKEN from the env
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    for batch in run.wrap_loader(loader):
        ...; run.log({"loss": loss}); run.step_boundary(step)

Importing this package imports neither torch nor Django; torch is imported only by the torch
helpers and the default checkpoint saver, ``websockets`` only by the push listener.
"""

__version__ = "0.1.0"

from brakeline.checkpoint import (  # noqa: E402 - __version__ first: submodules import it
    CheckpointResult,
    RestoredState,
    latest_checkpoint,
    restore,
    save_atomically,
    sha256_of,
)
from brakeline.commands import Command  # noqa: E402
from brakeline.handlers import ACK_LATER, CommandFailed, PauseInfo  # noqa: E402
from brakeline.rng import seed_everything  # noqa: E402
from brakeline.run import Run, init  # noqa: E402
from brakeline.settings import EXIT_TERMINATED, Settings  # noqa: E402

__all__ = [
    "ACK_LATER",
    "EXIT_TERMINATED",
    "CheckpointResult",
    "Command",
    "CommandFailed",
    "PauseInfo",
    "RestoredState",
    "Run",
    "Settings",
    "__version__",
    "init",
    "latest_checkpoint",
    "restore",
    "save_atomically",
    "seed_everything",
    "sha256_of",
]
