"""The fault suite's simulated jobs and scenarios (bench/faults.py): jobs driven through the real
``brakeline`` SDK, created in the fault stack's console, one scenario per fault."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench._faultstack import Stack

STEPS_PER_SECOND = 20.0
HUNG_TIMEOUT = 4.0  # the hung job's heartbeat timeout (seconds)
HEALTHY_TIMEOUT = 120.0  # every other job's: longer than any outage here

SETUP = """
import json, sys
from datetime import timedelta
from django.contrib.auth import get_user_model
from django.utils import timezone
from incidents.jobs import create_job
from incidents.models import Contact, Job, Membership, NotificationPolicy, OnCallShift, Team
spec = json.loads(sys.stdin.readline())
team, _ = Team.objects.get_or_create(name="faults")
if not Membership.objects.filter(team=team).exists():
    # A new team already has the default policy (incidents.teams): this one pages the fake
    # provider's chat webhook and the on-call's phone, and waits an hour before escalating.
    person = get_user_model().objects.create(username="oncall", email="oncall@example.org")
    Membership.objects.create(user=person, team=team, role="oncall")
    Contact.objects.create(user=person, phone="+15551110001")
    now = timezone.now()
    OnCallShift.objects.create(team=team, user=person, starts_at=now - timedelta(hours=1),
                               ends_at=now + timedelta(days=2))
    NotificationPolicy.objects.update_or_create(
        team=team, defaults={"chat_webhook_url": spec["chat"], "ack_timeout_seconds": 3600}
    )
jobs = {}
for name, timeout in spec["jobs"]:
    created = create_job("faults", name, "training")
    Job.objects.filter(pk=created.job.pk).update(heartbeat_timeout_seconds=timeout)
    jobs[name] = [created.job.pk, created.raw_token]
print("JOBS " + json.dumps(jobs))
"""


# --- A simulated job, driven through the SDK ------------------------------------------------


@dataclass
class SimJob:
    name: str
    job_id: int
    token: str
    nan_at: int | None = None  # first NaN step (NaN from then on, until braked)
    hang: threading.Event | None = None  # set: the loop stops stepping (and heartbeating)
    logged: list[int] = field(default_factory=list)
    nan_logged_at: float | None = None
    brakes: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, command id)
    step: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    run: object = None
    torch: bool = False  # a real tiny PyTorch training: its loss is a real (NaN) tensor
    checkpoint_fails: bool = False  # its brake's checkpoint fails (a read-only directory)

    def start(self, url: str, spill: Path) -> None:
        import brakeline

        self.run = run = brakeline.init(
            job=f"faults-{self.job_id}",
            url=url,
            token=self.token,
            spill_dir=str(spill),
            checkpoint_dir=str(spill / "ckpt"),
            flush_interval=0.2,
            heartbeat_interval=0.5,
            backoff_base=0.2,
            backoff_cap=1.5,
            http_timeout=5.0,
            send_snapshots=False,
            finish_timeout=60.0,
        )
        run.on_command("checkpoint_and_pause", self._braked)
        self.thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self.thread.start()

    def _braked(self, run, command, step: int) -> object:
        # The simulated checkpoint: note the moment, acknowledge, pause (heartbeats say
        # "paused"). ACK_LATER: this handler takes the command over from the built-in pause.
        from brakeline._commands import ACK_LATER

        self.brakes.append((time.monotonic(), command.id))
        run.set_status("paused")
        if self.checkpoint_fails:  # as the SDK answers when its save raised: held, no state
            error = "checkpoint failed (OSError: [Errno 30] Read-only file system)"
            run.ack(command.id, "failed", {"step": step, "paused": True}, error=error)
        else:
            run.ack(command.id, "succeeded", {"step": step, "simulated": True})
        return ACK_LATER

    @property
    def braked(self) -> bool:
        return bool(self.brakes)

    def _loop(self) -> None:
        run = self.run
        train = _torch_step() if self.torch else None
        while not self.stop.is_set():
            if self.braked or (self.hang is not None and self.hang.is_set()):
                time.sleep(0.1)  # paused, or hung: no more steps
                continue
            nan = self.nan_at is not None and self.step >= self.nan_at
            if nan and self.nan_logged_at is None:
                self.nan_logged_at = time.monotonic()
            loss = train(nan) if train else (math.nan if nan else 2.0 + 1.0 / (self.step + 1))
            run.log({"loss": loss}, step=self.step)
            self.logged.append(self.step)
            run.step_boundary(self.step)
            self.step += 1
            time.sleep(1.0 / STEPS_PER_SECOND)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.run.flush(timeout=120)
        self.run.finish(timeout=60)

    @property
    def brake_latency(self) -> float | None:
        if self.nan_logged_at is None or not self.brakes:
            return None
        return self.brakes[0][0] - self.nan_logged_at


def _torch_step() -> Callable[[bool], object]:
    """One optimiser step of a tiny regression per call; poisoned inputs make the loss NaN."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(poisoned: bool) -> object:
        inputs = torch.randn(16, 8)
        target = inputs.sum(dim=1, keepdim=True)
        if poisoned:
            inputs = inputs * float("nan")
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        optimizer.zero_grad()
        loss.backward()
        if not poisoned:
            optimizer.step()
        return loss.detach()

    return step


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


# --- A fault and its scenario ---------------------------------------------------------------


def brake_crossed_fault(stack: Stack, scenario: Scenario) -> str:
    """What most faults must prove: the NaN logged for the fault reached its brake only after
    the part went down, so the brake had to get through the fault (a brake done before the
    kill proves nothing about the fault)."""
    job, began = scenario.nan_during, scenario.fault_started
    if began is None or not job.brakes:
        return "the fault never began, or the NaN was never braked"
    if job.brakes[0][0] <= began:
        return f"the NaN was braked {began - job.brakes[0][0]:.2f} s before the part went down"
    return ""


@dataclass
class Fault:
    key: str
    title: str
    inject: Callable[[Stack, Scenario], None]  # kills/restarts; returns when the part is back
    # False where a probe cannot answer while the part is away: the health endpoint waits for
    # a database connection (the pool's timeout) rather than answering 503 at once, so during a
    # short PostgreSQL outage it answers after the return. The column is then reported only.
    red_required: bool = True
    # The healthy jobs' heartbeat timeout: longer than the outage, unless the fault is about
    # the console's outage being read as the jobs' silence.
    healthy_timeout: float = HEALTHY_TIMEOUT
    # At most this many seconds past its deadline the hung job must be caught (None: after the
    # part's return, whenever its moved deadline runs out).
    hung_within: float | None = None
    # What proves the fault overlapped the moment it claims to test: a sentence saying what
    # did not overlap, or "" when it did. Every fault proves something.
    overlapped: Callable[[Stack, Scenario], str] = brake_crossed_fault
    # The longest /api/v1/health may take to answer while the part is down (None: no bound).
    health_wait_within: float | None = None
    # The NaN's brake cannot save (its job answers "checkpoint failed"): that must page.
    brake_checkpoint_fails: bool = False


@dataclass
class Scenario:
    stack: Stack
    jobs: list[SimJob]
    nan_during: SimJob
    nan_after: SimJob
    hung: SimJob
    started: float = field(default_factory=time.monotonic)
    health: list[tuple[float, int]] = field(default_factory=list)
    health_waits: list[tuple[float, float]] = field(default_factory=list)  # (asked, seconds)
    fault_started: float | None = None
    fault_ended: float | None = None
    # What the fault recorded to prove it overlapped what it tests (wall-clock times, names).
    evidence: dict = field(default_factory=dict)

    def nan_now(self) -> None:
        """Make the "during" job go NaN at its next step."""
        self.nan_during.nan_at = self.nan_during.step

    def mark_down(self) -> None:
        self.fault_started = time.monotonic()

    def mark_up(self) -> None:
        self.fault_ended = time.monotonic()


def job_names(fault: str, count: int) -> list[str]:
    return [f"{fault}-{n}" for n in range(count)]


def job_timeouts(fault: Fault, count: int) -> dict[str, float]:
    """Each job of the fault with its heartbeat timeout: ``-2`` is the hung job's (short)."""
    return {
        name: HUNG_TIMEOUT if name.endswith("-2") else fault.healthy_timeout
        for name in job_names(fault.key, count)
    }


def create_jobs(stack: Stack, timeouts: dict[str, float]) -> dict[str, list]:
    """Jobs (job id, token) of these names, with their heartbeat timeouts."""
    spec = {"chat": stack.provider.url + "/hooks/chat", "jobs": list(timeouts.items())}
    output = stack.manage("shell", "-c", SETUP, stdin=json.dumps(spec) + "\n")
    return json.loads(output.split("JOBS ", 1)[1])


def make_jobs(
    stack: Stack, fault: Fault, count: int, spill: Path, created: dict[str, list] | None = None
) -> Scenario:
    names = job_names(fault.key, count)
    created = created or create_jobs(stack, job_timeouts(fault, count))
    jobs = [SimJob(name, *created[name]) for name in names]
    jobs[2].hang = threading.Event()
    jobs[1].torch = torch_available()  # the NaN after the fault comes out of real PyTorch
    jobs[0].checkpoint_fails = fault.brake_checkpoint_fails
    scenario = Scenario(stack, jobs, nan_during=jobs[0], nan_after=jobs[1], hung=jobs[2])
    for job in jobs:
        job.start(stack.url, spill / job.name)
    return scenario
