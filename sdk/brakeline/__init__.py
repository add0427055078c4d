"""Brakeline client SDK: stream metrics and heartbeats, obey console commands safely.

    run = brakeline.init(job="llm-7b")          # BRAKELINE_URL / BRAKELINE_TOKEN from the env
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    for batch in run.wrap_loader(loader):
        ...; run.log({"loss": loss}); run.step_boundary(step)

Importing this package imports neither torch nor Django; torch is imported only by the torch
helpers and the default checkpoint saver, ``websockets`` only by the push listener.

The public API is what this package exports, plus the modules ``brakeline.torch``,
``brakeline.snapshot`` and ``brakeline.integrations.*``; modules whose names start with an
underscore are internal and may change in any release.
"""

from brakeline._checkpoint import (
    CheckpointResult,
    CheckpointSet,
    IncompleteCheckpointSet,
    RestoredState,
    latest_checkpoint,
    latest_set,
    read_manifest,
    restore,
    save_atomically,
    sha256_of,
    verify_set,
)
from brakeline._commands import ACK_LATER, Command, CommandFailed
from brakeline._exit import EXIT_TERMINATED_UNDER_LAUNCHER
from brakeline._pause import PauseInfo, PauseState
from brakeline._rng import seed_everything
from brakeline._run import Run, init
from brakeline._settings import EXIT_TERMINATED, Settings
from brakeline._version import __version__

__all__ = [
    "ACK_LATER",
    "EXIT_TERMINATED",
    "EXIT_TERMINATED_UNDER_LAUNCHER",
    "CheckpointResult",
    "CheckpointSet",
    "IncompleteCheckpointSet",
    "Command",
    "CommandFailed",
    "PauseInfo",
    "PauseState",
    "RestoredState",
    "Run",
    "Settings",
    "__version__",
    "init",
    "latest_checkpoint",
    "latest_set",
    "read_manifest",
    "restore",
    "save_atomically",
    "seed_everything",
    "sha256_of",
    "verify_set",
]
