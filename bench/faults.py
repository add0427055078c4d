"""Faults survived, figures printed: the real services die under real load.

    python bench/faults.py                 # the full run: 8 jobs, beat down 20 s, console 30 s
    python bench/faults.py --jobs 4 --beat-down 10 --console-down 15 redis-ingest console-down

Simulated jobs stream through the real ``brakeline`` SDK at a steady rate to a whole console of
this script's own (bench/_faultstack.py: its own PostgreSQL cluster, Redis, Daphne, two Celery
workers, beat, and a fake provider). In each fault two jobs go NaN at a known step (one while
the part is down, one after; the second is a real tiny PyTorch training whose loss turns NaN),
one stops heartbeating a second before the part goes down; the others stay healthy.
After each fault the table says, per fault: brake latency (NaN logged → command in the SDK)
for the NaN that fell inside the fault and the one after it, time until the console was healthy
again, and the counts that must be zero: points lost and duplicated (per job, against the steps
the clients logged), NaNs not braked or braked twice, hung jobs missed, pages not delivered or
doubled, alerts and commands doubled, and whether /api/v1/health went red and came back green.
Exit status 1 when any of those counts is not zero. tests/faults/ runs it CI-sized.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "sdk")]

from bench._faultstack import Stack, wait_until  # noqa: E402

STEPS_PER_SECOND = 20.0
HUNG_TIMEOUT = 4.0  # the hung job's heartbeat timeout (seconds)
HEALTHY_TIMEOUT = 120.0  # every other job's: longer than any outage here
# Killed workers stay away this long: longer than the health endpoint's 5 s worker cache, so
# the endpoint can see that nobody answers.
WORKERS_DOWN = 6.0
HANG_LEAD = 1.0  # seconds between the hung job's last step and the fault (two heartbeats)

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

    def start(self, url: str, spill: Path) -> None:
        import brakeline

        self.run = run = brakeline.init(
            job=f"faults-{self.job_id}", url=url, token=self.token,
            spill_dir=str(spill), checkpoint_dir=str(spill / "ckpt"),
            flush_interval=0.2, heartbeat_interval=0.5, backoff_base=0.2, backoff_cap=1.5,
            http_timeout=5.0, send_snapshots=False, finish_timeout=60.0,
        )  # fmt: skip
        run.on_command("checkpoint_and_pause", self._braked)
        self.thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self.thread.start()

    def _braked(self, run, command, step: int) -> object:
        # The simulated checkpoint: note the moment, acknowledge, pause (heartbeats say
        # "paused"). ACK_LATER: this handler takes the command over from the built-in pause.
        from brakeline._commands import ACK_LATER

        self.brakes.append((time.monotonic(), command.id))
        run.set_status("paused")
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


# --- One fault ------------------------------------------------------------------------------


@dataclass
class Fault:
    key: str
    title: str
    inject: Callable[[Stack, Scenario], None]  # kills/restarts; returns when the part is back


@dataclass
class Scenario:
    stack: Stack
    jobs: list[SimJob]
    nan_during: SimJob
    nan_after: SimJob
    hung: SimJob
    started: float = field(default_factory=time.monotonic)
    health: list[tuple[float, int]] = field(default_factory=list)
    fault_started: float | None = None
    fault_ended: float | None = None

    def nan_now(self) -> None:
        """Make the "during" job go NaN at its next step."""
        self.nan_during.nan_at = self.nan_during.step

    def mark_down(self) -> None:
        self.fault_started = time.monotonic()

    def mark_up(self) -> None:
        self.fault_ended = time.monotonic()


def job_names(fault: str, count: int) -> list[str]:
    return [f"{fault}-{n}" for n in range(count)]


def create_jobs(stack: Stack, names: list[str]) -> dict[str, list]:
    """Jobs (job id, token) of these names; ``-2`` is each fault's hung job (short timeout)."""
    spec = {
        "chat": stack.provider.url + "/hooks/chat",
        "jobs": [[name, HUNG_TIMEOUT if name.endswith("-2") else HEALTHY_TIMEOUT]
                 for name in names],
    }  # fmt: skip
    output = stack.manage("shell", "-c", SETUP, stdin=json.dumps(spec) + "\n")
    return json.loads(output.split("JOBS ", 1)[1])


def make_jobs(
    stack: Stack, fault: str, count: int, spill: Path, created: dict[str, list] | None = None
) -> Scenario:
    names = job_names(fault, count)
    created = created or create_jobs(stack, names)
    jobs = [SimJob(name, *created[name]) for name in names]
    jobs[2].hang = threading.Event()
    jobs[1].torch = torch_available()  # the NaN after the fault comes out of real PyTorch
    scenario = Scenario(stack, jobs, nan_during=jobs[0], nan_after=jobs[1], hung=jobs[2])
    for job in jobs:
        job.start(stack.url, spill / job.name)
    return scenario


def _poll_health(scenario: Scenario, stopping: threading.Event) -> None:
    while not stopping.is_set():
        scenario.health.append((time.monotonic(), scenario.stack.health()[0]))
        stopping.wait(0.2)


def run_fault(
    stack: Stack, fault: Fault, jobs: int, spill: Path, created: dict[str, list] | None = None
) -> dict:
    scenario = make_jobs(stack, fault.key, jobs, spill, created)
    stopping = threading.Event()
    poller = threading.Thread(target=_poll_health, args=(scenario, stopping), daemon=True)
    poller.start()
    try:
        wait_until(lambda: all(len(j.logged) > 20 for j in scenario.jobs), "jobs to stream", 60)
        # The hung job stops a little before the fault, so its last heartbeat has landed: one
        # still in flight when the part dies would arrive after the deadline, resolve the
        # alert (it does report progress) and the job would be alerted a second time.
        scenario.hung.hang.set()  # type: ignore[union-attr]
        time.sleep(HANG_LEAD)
        fault.inject(stack, scenario)
        scenario.mark_up()
        # After the fault: the second NaN, then everything the console owes.
        scenario.nan_after.nan_at = scenario.nan_after.step
        recovered = _recover(stack, scenario)
    finally:
        stopping.set()
        poller.join(5)
        # All at once: each flushes what it still holds, then ends its threads.
        finishing = [threading.Thread(target=job.finish) for job in scenario.jobs]
        for thread in finishing:
            thread.start()
        for thread in finishing:
            thread.join(180)
    return measure(stack, scenario, recovered)


def _recover(stack: Stack, scenario: Scenario) -> float | None:
    """Seconds from the part's return to a healthy console that has done all it owes."""
    owed: dict[str, object] = {}

    def done() -> bool:
        owed["braked"] = scenario.nan_during.braked and scenario.nan_after.braked
        owed["hung"] = _hung_alerts(stack, scenario)
        owed["health"] = stack.health()
        owed["pending_pages"] = _pending_pages(stack, scenario)
        return bool(
            owed["braked"]
            and owed["hung"]
            and owed["health"][0] == 200  # type: ignore[index]
            and not owed["pending_pages"]
        )

    try:
        wait_until(done, "the console to catch up", timeout=120, interval=0.25)
    except TimeoutError:
        print(f"{scenario.jobs[0].name}: not caught up: {owed}", file=sys.stderr)
        return None
    return time.monotonic() - (scenario.fault_ended or time.monotonic())


def _hung_alerts(stack: Stack, scenario: Scenario) -> int:
    return stack.sql(
        "SELECT count(*) FROM incidents_alert WHERE job_id = %s AND rule_key = %s",
        (scenario.hung.job_id, "heartbeat-timeout"),
    )[0][0]


def _ids(scenario: Scenario) -> list[int]:
    return [job.job_id for job in scenario.jobs]


def _pending_pages(stack: Stack, scenario: Scenario) -> int:
    """Pages still owed: queued deliveries, and alerts not dispatched at all yet."""
    return stack.sql(
        "SELECT (SELECT count(*) FROM incidents_delivery d JOIN incidents_alert a ON "
        "a.id = d.alert_id WHERE a.job_id = ANY(%s) AND d.status = 'queued') + (SELECT count(*) "
        "FROM incidents_alert a WHERE a.job_id = ANY(%s) AND a.layer <> 'performance' AND NOT "
        "EXISTS (SELECT 1 FROM incidents_delivery d WHERE d.alert_id = a.id))",
        (_ids(scenario), _ids(scenario)),
    )[0][0]


def measure(stack: Stack, scenario: Scenario, recovered: float | None) -> dict:
    ids = _ids(scenario)
    rows = stack.sql(
        "SELECT job_id, count(*), count(DISTINCT step) FROM breakers_metricpoint "
        "WHERE job_id = ANY(%s) AND name = 'loss' GROUP BY job_id",
        (ids,),
    )
    stored = {job_id: (total, distinct) for job_id, total, distinct in rows}
    lost = duplicated = 0
    for job in scenario.jobs:
        total, distinct = stored.get(job.job_id, (0, 0))
        lost += len(set(job.logged)) - distinct
        duplicated += total - distinct
    commands = dict(
        stack.sql(
            "SELECT job_id, count(*) FROM breakers_command WHERE job_id = ANY(%s) GROUP BY job_id",
            (ids,),
        )
    )
    nan_jobs = [scenario.nan_during, scenario.nan_after]
    alerts_doubled = stack.sql(
        "SELECT count(*) FROM (SELECT job_id, rule_key FROM incidents_alert WHERE job_id = ANY(%s)"
        " GROUP BY job_id, rule_key HAVING count(*) > 1) doubled",
        (ids,),
    )[0][0]
    pages = stack.sql(
        "SELECT d.id, d.status, d.alert_id, d.channel, d.round_id FROM incidents_delivery d "
        "JOIN incidents_alert a ON a.id = d.alert_id WHERE a.job_id = ANY(%s)",
        (ids,),
    )
    # An alert that should page and has no delivery at all: its dispatch was lost.
    unpaged = stack.sql(
        "SELECT count(*) FROM incidents_alert a WHERE a.job_id = ANY(%s) AND a.layer <> "
        "'performance' AND NOT EXISTS (SELECT 1 FROM incidents_delivery d WHERE d.alert_id = a.id)",
        (ids,),
    )[0][0]
    # Alerts no scenario asked for: any rule on a healthy job, any other rule on the others.
    expected = {scenario.nan_during.job_id: "non-finite-loss-or-gradients",
                scenario.nan_after.job_id: "non-finite-loss-or-gradients",
                scenario.hung.job_id: "heartbeat-timeout"}  # fmt: skip
    alerts = stack.sql(
        "SELECT job_id, rule_key FROM incidents_alert WHERE job_id = ANY(%s)", (ids,)
    )
    unexpected = sum(1 for job_id, rule in alerts if expected.get(job_id) != rule)
    keys = stack.provider.pages()
    unsent = [p for p in pages if p[1] not in ("sent", "delivered")]
    doubled_pages = len(pages) - len({(p[2], p[3], p[4]) for p in pages})
    undelivered = sum(1 for p in pages if keys.get(f"brakeline-delivery-{p[0]}", 0) == 0)
    began, ended = scenario.fault_started or 0.0, scenario.fault_ended or 0.0
    down = [status for at, status in scenario.health if began <= at <= ended]
    return {
        "brake_during": scenario.nan_during.brake_latency,
        "brake_after": scenario.nan_after.brake_latency,
        "recover": recovered,
        "lost": lost,
        "duplicated": duplicated,
        "nan_missed": sum(1 for job in nan_jobs if not job.braked),
        "nan_doubled": sum(1 for job in nan_jobs if commands.get(job.job_id, 0) > 1),
        "hung_missed": 0 if _hung_alerts(stack, scenario) else 1,
        "commands_doubled": sum(1 for job in scenario.jobs if commands.get(job.job_id, 0) > 1),
        "false_brakes": sum(
            1
            for job in scenario.jobs
            if job not in (*nan_jobs, scenario.hung) and commands.get(job.job_id, 0)
        ),  # fmt: skip
        "alerts_doubled": alerts_doubled,
        "other_alerts": unexpected,
        "pages": len(pages),
        "pages_missed": len(unsent) + undelivered + unpaged,
        "pages_doubled": doubled_pages,
        "pages_resent": sum(1 for p in pages if keys.get(f"brakeline-delivery-{p[0]}", 0) > 1),
        "health_red": any(status != 200 for status in down) if down else None,
        "health_green": recovered is not None,
    }


# --- The faults -----------------------------------------------------------------------------


def _nan_then(action: Callable[[], None], scenario: Scenario, lead: float = 0.3) -> None:
    """The NaN goes out, then (lead seconds later, while it is being evaluated) the fault."""
    scenario.nan_now()
    wait_until(lambda: scenario.nan_during.nan_logged_at, "the NaN to be logged", 10, 0.01)
    time.sleep(lead)
    scenario.mark_down()
    action()


def redis_mid_ingest(stack: Stack, scenario: Scenario) -> None:
    scenario.mark_down()
    stack.shutdown_redis()
    scenario.nan_now()  # the NaN is logged while Redis is away
    time.sleep(3)
    stack.start_redis()


def redis_mid_brake(stack: Stack, scenario: Scenario) -> None:
    _nan_then(stack.shutdown_redis, scenario, lead=0.2)
    time.sleep(3)
    stack.start_redis()


def postgres_mid_ingest(stack: Stack, scenario: Scenario) -> None:
    scenario.mark_down()
    scenario.nan_now()
    stack.restart_postgres()


def worker_mid_evaluation(stack: Stack, scenario: Scenario) -> None:
    # Every worker, the moment the NaN's batch is stored: its evaluation is under way or queued.
    scenario.nan_now()
    wait_until(
        lambda: stack.sql(
            "SELECT 1 FROM breakers_metricpoint WHERE job_id = %s AND value = 'NaN' LIMIT 1",
            (scenario.nan_during.job_id,),
        ),
        "the NaN batch to be stored", 20, 0.005,
    )  # fmt: skip
    scenario.mark_down()
    for name in stack.worker_names:
        stack.kill(name)
    time.sleep(WORKERS_DOWN)
    for name in stack.worker_names:
        stack.start_worker(name)


def worker_mid_delivery(stack: Stack, scenario: Scenario) -> None:
    provider = stack.provider
    provider.arrived.clear()
    provider.hold = threading.Event()
    scenario.nan_now()
    wait_until(provider.arrived.is_set, "a page to be under way", 60, 0.01)
    scenario.mark_down()
    for name in stack.worker_names:  # whichever holds the send
        stack.kill(name)
    provider.hold.set()
    provider.hold = None
    time.sleep(WORKERS_DOWN)
    for name in stack.worker_names:
        stack.start_worker(name)


def beat_down(seconds: float) -> Callable[[Stack, Scenario], None]:
    def inject(stack: Stack, scenario: Scenario) -> None:
        scenario.mark_down()
        stack.kill("beat")
        scenario.nan_now()
        time.sleep(seconds)
        stack.start_beat()

    return inject


def daphne_killed(stack: Stack, scenario: Scenario) -> None:
    scenario.mark_down()
    stack.kill("daphne", signal.SIGKILL)
    scenario.nan_now()
    time.sleep(1)
    stack.start_daphne()


def console_down(seconds: float) -> Callable[[Stack, Scenario], None]:
    def inject(stack: Stack, scenario: Scenario) -> None:
        scenario.mark_down()
        stack.kill_console()
        scenario.nan_now()
        time.sleep(seconds)
        stack.start_console()

    return inject


def faults(beat_seconds: float = 20.0, console_seconds: float = 30.0) -> list[Fault]:
    return [
        Fault("redis-ingest", "Redis restarted (shutdown nosave) mid-ingest", redis_mid_ingest),
        Fault("redis-brake", "Redis restarted mid-brake", redis_mid_brake),
        Fault("postgres-ingest", "PostgreSQL restarted (-m fast) mid-ingest", postgres_mid_ingest),
        Fault("worker-eval", "Celery workers SIGKILLed mid-evaluation", worker_mid_evaluation),
        Fault("worker-delivery", "Celery workers SIGKILLed mid-delivery", worker_mid_delivery),
        Fault("beat-down", f"beat killed for {beat_seconds:g} s", beat_down(beat_seconds)),
        Fault("daphne-killed", "Daphne SIGKILLed and restarted", daphne_killed),
        Fault("console-down", f"whole console down {console_seconds:g} s",
              console_down(console_seconds)),
    ]  # fmt: skip


ZERO_COLUMNS = (
    "lost", "duplicated", "nan_missed", "nan_doubled", "hung_missed", "commands_doubled",
    "false_brakes", "alerts_doubled", "other_alerts", "pages_missed", "pages_doubled",
)  # fmt: skip


def failures(result: dict) -> list[str]:
    bad = [f"{column}={result[column]}" for column in ZERO_COLUMNS if result[column]]
    if result["health_red"] is False:
        bad.append("health stayed green while a part was down")
    if not result["health_green"]:
        bad.append("the console did not recover")
    return bad


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def table(results: list[tuple[Fault, dict]]) -> str:
    header = (
        f"{'fault':<44} {'brake during':>12} {'after':>6} {'recover':>8} {'lost':>5} "
        f"{'dup':>4} {'missed':>6} {'2x':>3} {'hung':>4} {'false':>5} {'other':>5} {'pages':>5} "
        f"{'p-miss':>6} {'p-2x':>4} {'resent':>6} {'red':>4} {'green':>5}"
    )
    lines = [header, "-" * len(header)]
    for fault, r in results:
        doubled = r["nan_doubled"] + r["commands_doubled"] + r["alerts_doubled"]
        lines.append(
            f"{fault.title:<44} {_seconds(r['brake_during']):>12} {_seconds(r['brake_after']):>6} "
            f"{_seconds(r['recover']):>8} {r['lost']:>5} {r['duplicated']:>4} "
            f"{r['nan_missed']:>6} {doubled:>3} "
            f"{r['hung_missed']:>4} {r['false_brakes']:>5} {r['other_alerts']:>5} "
            f"{r['pages']:>5} {r['pages_missed']:>6} "
            f"{r['pages_doubled']:>4} {r['pages_resent']:>6} "
            f"{'yes' if r['health_red'] else 'NO' if r['health_red'] is False else '—':>4} "
            f"{'yes' if r['health_green'] else 'NO':>5}"
        )  # fmt: skip
    lines.append(
        "brake: seconds from the NaN logged to the command in the SDK (during the fault / after "
        "it); recover: seconds from the part's return to a healthy console that braked, "
        "detected and paged everything; missed/2x: NaNs not braked / alerts or commands "
        "doubled; hung: hung jobs missed; false: healthy jobs braked; other: alerts of a rule "
        "the scenario did not provoke (a breakers-failing alert, say); p-miss/p-2x: pages not "
        "delivered / doubled; resent: pages sent again with the same idempotency key "
        "(once for the person); red/green: /api/v1/health while the part was down / after."
    )
    return "\n".join(lines)


def run(keys: list[str], jobs: int, beat_seconds: float, console_seconds: float,
        stack: Stack | None = None) -> list[tuple[Fault, dict]]:  # fmt: skip
    chosen = [f for f in faults(beat_seconds, console_seconds) if not keys or f.key in keys]
    own = stack is None
    stack = stack or Stack()
    results = []
    try:
        if own:
            stack.start()
        names = [name for fault in chosen for name in job_names(fault.key, jobs)]
        created = create_jobs(stack, names)
        with tempfile.TemporaryDirectory(prefix="brakeline-faults-spill-") as spill:
            for fault in chosen:
                started = time.monotonic()
                result = run_fault(stack, fault, jobs, Path(spill), created)
                result["seconds"] = time.monotonic() - started
                results.append((fault, result))
                print(f"{fault.key}: {time.monotonic() - started:.1f} s", file=sys.stderr)
    finally:
        if own:
            stack.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("faults", nargs="*", help="fault keys (default: all)")
    parser.add_argument("--jobs", type=int, default=8, help="simulated jobs per fault (≥ 3)")
    parser.add_argument("--beat-down", type=float, default=20.0)
    parser.add_argument("--console-down", type=float, default=30.0)
    options = parser.parse_args()
    results = run(options.faults, max(3, options.jobs), options.beat_down, options.console_down)
    print(table(results))
    broken = {fault.key: failures(result) for fault, result in results if failures(result)}
    for key, what in broken.items():
        print(f"FAILED {key}: {', '.join(what)}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
