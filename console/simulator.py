"""A simulated training run for the demo: it speaks the agent protocol over plain HTTP.

Healthy at first (a noisy, decaying loss), then it diverges on purpose and finally produces a
NaN, so the console has something to brake. It obeys commands the way the SDK does: at a step
boundary, `checkpoint_and_pause` stops stepping, writes a checkpoint, acknowledges with its
path, size and hash, then waits (heartbeating as paused) for `resume` or `terminate`.
Standard library only, like any agent could be.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from core.nonfinite import spell


@dataclass
class SimulatedRun:
    url: str
    token: str
    checkpoint_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))
    diverge_at_step: int = 900
    nan_at_step: int = 1100
    steps_per_second: float = 20.0
    seed: int = 7
    step: int = 0
    status: str = "running"
    seen_commands: set[int] = field(default_factory=set)
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def loss_at(self, step: int) -> float:
        if step >= self.nan_at_step:
            return math.nan
        healthy = 2.0 + 6.0 * math.exp(-step / 250) + self.rng.gauss(0, 0.04)
        if step < self.diverge_at_step:
            return healthy
        return healthy * math.exp((step - self.diverge_at_step) / 60)

    def points_for(self, step: int) -> list[dict]:
        loss = self.loss_at(step)
        grad_norm = 1.0 + self.rng.random() * 0.2 if math.isfinite(loss) else math.inf
        values = {
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": 3e-4,
            "perf.samples_per_second": 950 + self.rng.gauss(0, 15),
        }
        return [
            {"name": name, "step": step, "value": _encode(value)} for name, value in values.items()
        ]

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(
            self.url.rstrip("/") + path,
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"{}")

    def heartbeat(self) -> list[dict]:
        body = {"step": self.step, "status": self.status, "pid": os.getpid()}
        return self.post("/api/v1/agent/heartbeat", body)["commands"]

    def save_checkpoint(self) -> dict:
        started = time.monotonic()
        path = self.checkpoint_dir / f"simulated-step-{self.step}.json"
        data = json.dumps({"step": self.step, "seed": self.seed}).encode()
        path.write_bytes(data)
        return {
            "path": str(path),
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "seconds": round(time.monotonic() - started, 6),
            "step": self.step,
        }

    def obey(self, commands: list[dict]) -> None:
        """Apply new commands at this step boundary, acknowledging each with its result."""
        for command in commands:
            if command["id"] in self.seen_commands:
                continue
            self.seen_commands.add(command["id"])
            result: dict = {"step": self.step}
            if command["kind"] == "checkpoint_and_pause":
                self.status = "checkpointing"
                result = self.save_checkpoint()  # stepping has already stopped: we are here
                self.status = "paused"
            elif command["kind"] == "resume":
                self.status = "running"
            elif command["kind"] == "terminate":
                self.status = "terminated"
            self.post(
                f"/api/v1/agent/commands/{command['id']}/ack",
                {"status": "succeeded", "result": result},
            )

    def run(self, *, max_steps: int | None = None, batch_steps: int = 10) -> None:
        """Stream until ``max_steps`` (forever when None); survives a console that is away."""
        interval = batch_steps / self.steps_per_second
        while (max_steps is None or self.step < max_steps) and self.status != "terminated":
            try:
                if self.status == "running":
                    points = []
                    for _ in range(batch_steps):
                        points.extend(self.points_for(self.step))
                        self.step += 1
                    self.obey(self.post("/api/v1/agent/metrics", {"points": points})["commands"])
                self.obey(self.heartbeat())
            except (urllib.error.URLError, OSError) as error:
                print(f"simulator: console unreachable ({error}); retrying")
            time.sleep(interval)


def _encode(value: float) -> float | str:
    return value if math.isfinite(value) else spell(value)
