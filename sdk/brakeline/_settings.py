"""Run settings: explicit arguments first, then BRAKELINE_* environment variables, then defaults.

Every interval is a plain attribute so a test can shrink them (for example
``heartbeat_interval=0.1``) when it runs against a real console.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Exit code of a process stopped by a ``terminate`` command (EX_TEMPFAIL in sysexits.h).
EXIT_TERMINATED = 75

# Environment variable -> settings field. Values are converted by the field's default type.
ENVIRONMENT_VARIABLES: dict[str, str] = {
    "BRAKELINE_URL": "url",
    "BRAKELINE_TOKEN": "token",
    "BRAKELINE_WS_URL": "ws_url",
    "BRAKELINE_JOB": "job",
    "BRAKELINE_NODE": "node",
    "BRAKELINE_RANK": "rank",
    "BRAKELINE_SPILL_DIR": "spill_dir",
    "BRAKELINE_CHECKPOINT_DIR": "checkpoint_dir",
    "BRAKELINE_HEARTBEAT_INTERVAL": "heartbeat_interval",
    "BRAKELINE_FLUSH_INTERVAL": "flush_interval",
    "BRAKELINE_HTTP_TIMEOUT": "http_timeout",
    "BRAKELINE_WEBSOCKET": "use_websocket",
    "BRAKELINE_SNAPSHOTS": "send_snapshots",
    "BRAKELINE_GUARD": "guard",
    "BRAKELINE_GUARD_DEVICE": "guard_device",
    "BRAKELINE_RERUN_NONFINITE": "rerun_nonfinite",
    "BRAKELINE_RANK_AGREEMENT": "rank_agreement",
    "BRAKELINE_AGREEMENT_EVERY": "agreement_every",
    "BRAKELINE_CHECKPOINT_SETS": "checkpoint_sets",
    "BRAKELINE_TIME_SYNC": "time_sync",
    "BRAKELINE_NODE_FORWARDING": "node_forwarding",
    "BRAKELINE_NODE_WINDOW": "node_window",
    "BRAKELINE_NODE_DIR": "node_dir",
}


@dataclasses.dataclass
class Settings:
    """Everything a run can be tuned with. Build one with :func:`resolve_settings`."""

    url: str = ""
    token: str = ""
    ws_url: str = ""
    job: str = "default"
    node: str = ""
    rank: int = 0
    spill_dir: str = ""
    checkpoint_dir: str = ""
    # Metrics: a batch leaves when it holds batch_points points or flush_interval has passed.
    batch_points: int = 1000
    batch_bytes: int = 1024 * 1024
    flush_interval: float = 1.0
    # Bounded memory: points beyond max_memory_points go to the spill file; run.log calls made
    # while the background thread is stuck, beyond max_queue_records, are dropped (and counted).
    max_memory_points: int = 50_000
    max_queue_records: int = 100_000
    max_spill_bytes: int = 512 * 1024 * 1024
    heartbeat_interval: float = 5.0
    # After the first step, a heartbeat is only sent when the training thread made progress
    # (or is deliberately paused), so a hung loop shows up as a heartbeat timeout.
    heartbeat_requires_progress: bool = True
    http_timeout: float = 10.0
    backoff_base: float = 0.5
    backoff_cap: float = 30.0
    max_retry_after: float = 300.0
    use_websocket: bool = True
    # Environment snapshots at start and at each checkpoint (a package scan per snapshot).
    send_snapshots: bool = True
    # How long finish() and terminate wait for the console before giving up (data stays spilled).
    finish_timeout: float = 10.0
    ack_wait_before_release: float = 5.0
    # In a process group of 2+ ranks, run.checkpoint is collective (every rank, same step) and
    # rank 0 writes the set's manifest (docs/sdk.md "Checkpoint sets"); False: per-rank files.
    checkpoint_sets: bool = True
    # run.watch(model=<DistributedDataParallel>) times the gradient sync with a communication
    # hook (brakeline._pace: each rank's own compute time, the sync it entered); False leaves
    # the model's hooks to you (compute time is then measured boundary to boundary).
    time_sync: bool = True
    # The step guard (docs/sdk.md "The step guard"): skip optimizer updates computed from
    # NaN/Inf, then hold at the boundary for up to guard_hold_seconds for the console's rules.
    guard: bool = True
    guard_hold_seconds: float = 30.0
    # Where the guard refuses an update whose flag lives on an accelerator: "auto" on the
    # device (no host read that step), "always" on the device path even on the CPU, "late"
    # not at all (read a step late and reported: one update through, no copies).
    guard_device: str = "auto"
    # Re-run to attribute (docs/sdk.md "Re-run to attribute"): a refused step computed by a
    # closure (optimizer.step(closure)) is evaluated once more from the unchanged pre-step
    # state, same batch, same generators; the brake's acknowledgement says whether the
    # non-finite value repeated ("data") or not ("transient"). Runs your closure twice.
    rerun_nonfinite: bool = False
    # A delivered command still waiting after this many run.log calls: step_boundary is not
    # being called (a warning in the training log, once per command).
    unapplied_command_logs: int = 50
    # Multi-rank jobs (docs/sdk.md "Many ranks, one step"): "auto" agrees at the boundary
    # through torch.distributed's default group where it is initialised, "off" never ("on":
    # as auto, and says so loudly when there is no group). Every agreement_every-th step
    # boundary, the same on every rank; a rank missing a command another rank applies there
    # waits for it up to agreement_wait_seconds.
    rank_agreement: str = "auto"
    agreement_every: int = 1
    agreement_wait_seconds: float = 60.0
    # One conversation per node (docs/sdk.md "One conversation per node"): "auto" sends the
    # ranks' requests through their node's forwarder (local rank 0) wherever the launcher
    # says a node has several ranks (LOCAL_RANK, LOCAL_WORLD_SIZE), "off" never. The
    # forwarder waits up to node_window seconds (0: flush_interval) for every rank of the
    # node before it sends; its unix socket lives in node_dir (default: a folder of this
    # user's in the temporary directory).
    node_forwarding: str = "auto"
    node_window: float = 0.0
    node_dir: str = ""

    @property
    def enabled(self) -> bool:
        """False when no console URL or token is configured: the run works offline."""
        return bool(self.url and self.token)

    @property
    def websocket_url(self) -> str:
        """The agent websocket endpoint, derived from ``url`` unless ``ws_url`` is set."""
        base = self.ws_url or _http_to_ws(self.url)
        base = base.rstrip("/")
        return base if base.endswith("/ws/agent") else base + "/ws/agent/"


def _http_to_ws(url: str) -> str:
    if url.startswith("https://"):
        return "wss://" + url[len("https://") :]
    if url.startswith("http://"):
        return "ws://" + url[len("http://") :]
    return url


def _convert(raw: str, default: Any) -> Any:
    if isinstance(default, bool):
        return raw.strip().lower() in {"1", "true", "yes", "on"}
    if isinstance(default, int):
        return int(raw)
    if isinstance(default, float):
        return float(raw)
    return raw


def default_rank(environ: Mapping[str, str]) -> int:
    """The process rank as torchrun, Slurm or MPI announce it; 0 for a single process."""
    for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def resolve_settings(
    overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Merge explicit overrides (None means "not given") over the environment over defaults."""
    environ = os.environ if environ is None else environ
    defaults = Settings()
    values: dict[str, Any] = {"rank": default_rank(environ)}
    for variable, field in ENVIRONMENT_VARIABLES.items():
        if environ.get(variable):
            values[field] = _convert(environ[variable], getattr(defaults, field))
    known = {field.name for field in dataclasses.fields(Settings)}
    for name, value in (overrides or {}).items():
        if name not in known:
            raise TypeError(f"unknown brakeline setting: {name!r}")
        if value is not None:
            values[name] = value
    settings = dataclasses.replace(defaults, **values)
    settings.url = settings.url.rstrip("/")
    # Under Slurm, the scheduler's name of the node (what the console drains), else the host.
    node = settings.node or environ.get("SLURMD_NODENAME") or socket.gethostname()
    settings.node = node[:200]
    settings.spill_dir = settings.spill_dir or str(Path.cwd() / ".brakeline" / "spill")
    settings.checkpoint_dir = settings.checkpoint_dir or str(
        Path.cwd() / "brakeline-checkpoints" / settings.job
    )
    return settings
