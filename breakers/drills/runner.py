"""Carrying out a drill: sandbox job, workload, fault, then the facts the scorecard judges.

Each scenario runs on a sandbox job of its own (``Job.drill_sandbox``), the scenarios of a set
at the same time, in threads: the built-in workload (``workload.py``, real PyTorch through the
SDK) is started by the job's executor — a local process, or ``sbatch`` on Slurm — and once it
steps, the console sends ``inject_fault``. From then on the drill only watches what the real
stack does (the Celery workers' rules, the watchdog, the control plane, the notifications) and
reads the outcome back from the console's own records. Nothing here brakes, pages or saves
anything itself.

Before anything starts, the drill command asks the console the sandboxes will report to for
its health (``console_check``: a drill against a console that does not answer would only wait
out its deadlines).
While a scenario runs, its stages go to ``progress`` (the command prints them). Stopped from
outside (Ctrl-C, SIGTERM: a ``KeyboardInterrupt`` in the main thread), the set is cancelled:
every wait ends at once, each drill becomes "error", and each sandbox is still ended — through
the console, briefly, then its whole session killed — before the interrupt goes on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from breakers.control.commands import issue_command
from breakers.control.hearing import forgiven_so_far
from breakers.declarations import declare_own_root
from breakers.detection.shadow import would_have_fired
from breakers.drills import runs
from breakers.drills.checkpoint_facts import checkpoint_facts
from breakers.drills.launch import (
    RELEASE_MARKER,
    Sandbox,
    base_environment,
    launch_sandbox,
    sandboxed,
)
from breakers.drills.paged_line import paging_facts
from breakers.drills.recovery_facts import recovery_facts
from breakers.drills.scenarios import RECOVERS, SCENARIOS, Scenario
from breakers.drills.scorecard import DETECT_MARGIN_SECONDS, Facts, score
from breakers.models import (
    Command,
    CommandKind,
    CommandStatus,
    DrillRun,
    DrillStatus,
    RuleSetVersion,
)
from breakers.storage.points import StoredPoint, first_point
from core.errors import ServiceError
from incidents.alerts.lifecycle import resolve_alert
from incidents.heartbeats import heartbeat_timeout_seconds
from incidents.jobs import create_job
from incidents.models import (
    ActorKind,
    Alert,
    Job,
    JobStatus,
    TimelineEntry,
    TimelineKind,
)
from incidents.notifications.delivery import stop_notifications

log = logging.getLogger(__name__)
WORKLOAD = Path(__file__).resolve().parent / "workload.py"
FAULT_METRIC = "drill.fault"  # the SDK's (brakeline._drill.FAULT_METRIC)
WARM_UP_STEPS = 12  # past the first periodic checkpoint (the workload's, every 10 steps)
FAULT_MARGIN_STEPS = 8  # the command must reach the job before the fault's step
MAX_PARALLEL = len(SCENARIOS)  # the whole set at once: it lasts as long as its slowest
WARM_UP_PROGRESS_SECONDS = 15.0  # "still waiting for the workload" this often
CANCELLED_GRACE_SECONDS = 5.0  # a stopped runner's sandbox: this long to take the terminate
RELEASE_WAIT = 30.0  # from the confirmed brake to the release hooks' note, at most
STOPPED = "the drill's runner was stopped (Ctrl-C or SIGTERM)"


class DrillError(Exception):
    """The drill could not be carried out (the verdict is then "error", not "failed")."""


class DrillCancelled(DrillError):
    """The runner was stopped (Ctrl-C, SIGTERM) before the drill finished."""


# Per drill thread: the set's cancellation and where its progress lines go (run_drill_set).
_context = threading.local()


def _cancelled() -> bool:
    event = getattr(_context, "cancelled", None)
    return event is not None and event.is_set()


def _say(run: DrillRun, what: str) -> None:
    say = getattr(_context, "progress", None)
    if say is not None:
        say(f"drill #{run.pk} ({run.scenario}): {what}")


def _stage(run: DrillRun, what: str) -> None:
    started = run.started_at or timezone.now()
    elapsed = (timezone.now() - started).total_seconds()
    log.info("drill #%s (%s): %s after %.1f s", run.pk, run.scenario, what, elapsed)
    _say(run, f"{what} after {elapsed:.1f} s")


def wait_until(
    predicate: Callable[[], Any], what: str, timeout: float, sandbox=None, *, cancellable=True
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if sandbox is not None and sandbox.exited_early():
            raise DrillError(f"the sandbox exited while waiting for {what}: {sandbox.tail()}")
        if cancellable and _cancelled():
            raise DrillCancelled(STOPPED)
        time.sleep(0.1)
    return None


def run_drill_set(
    drill_set: uuid.UUID | str,
    *,
    console_url: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[DrillRun]:
    """Every queued run of the set, at the same time (each on its own sandbox job, so their
    alerts never group into one page); returns them finished, in the set's order.

    ``progress`` receives a line per stage of each drill (from the drills' threads). A
    ``KeyboardInterrupt`` (Ctrl-C, or SIGTERM turned into one by the command) cancels the
    set: the drills end as "error", their sandboxes are ended, then it is raised again."""
    queued = list(
        DrillRun.objects.filter(drill_set=drill_set, status=DrillStatus.QUEUED).order_by("pk")
    )
    if not queued:
        return []
    cancelled = threading.Event()

    def one(run: DrillRun) -> DrillRun:
        _context.cancelled, _context.progress = cancelled, progress
        try:
            return run_drill(run, console_url=console_url)
        finally:
            connection.close()  # this thread's own connection

    pool = ThreadPoolExecutor(max_workers=min(len(queued), MAX_PARALLEL))
    try:
        futures = [pool.submit(one, run) for run in queued]
        return [future.result() for future in futures]
    except BaseException:
        cancelled.set()  # every wait of every drill ends now; their clean-ups still run
        if progress is not None:
            progress("stopping: ending the sandboxes of the drill set")
        raise
    finally:
        pool.shutdown(wait=True)  # a run not started yet starts, sees the cancel, ends


def run_drill(run: DrillRun, *, console_url: str | None = None) -> DrillRun:
    runs.start(run)
    scenario = SCENARIOS[run.scenario]
    sandbox: Sandbox | None = None
    try:
        job, token = _sandbox_job(run)
        work_dir = runs.drill_folder() / str(run.drill_set) / f"{run.pk}-{run.scenario}"
        work_dir.mkdir(parents=True, exist_ok=True)
        declare_own_root(job, str(work_dir))  # its checkpoints are catalogued from there only
        url = console_url or str(settings.BRAKELINE_PUBLIC_URL)
        arguments = workload_arguments(run, work_dir)
        if _cancelled():
            raise DrillCancelled(STOPPED)
        sandbox = launch_sandbox(run.executor, job, token, url, work_dir, arguments)
        _say(run, f"workload started ({sandbox.describe()}) on job {job.pk}, reporting to {url}")
        facts, figures = _drive(run, scenario, job, sandbox)
        lines = score(scenario, facts)
        finished = runs.finish(run, lines, **figures)
        _say(finished, f"{finished.status}; ending its sandbox")
        return finished
    except Exception as error:  # a bug of ours too: no drill is left "running" for ever
        known = isinstance(error, (DrillError, ServiceError, OSError))
        say = log.warning if known else log.exception
        say("drill #%s (%s) could not be carried out: %s", run.pk, run.scenario, error)
        runs.fail_with_error(run, f"{type(error).__name__}: {error}")
        run.refresh_from_db()
        first_line = (str(error).splitlines() or [type(error).__name__])[0]
        _say(run, f"could not be carried out: {first_line}")
        return run
    finally:
        if sandbox is not None:
            _clean_up(run, sandbox)


def workload_arguments(run: DrillRun, work_dir: Path) -> list[str]:
    """The built-in workload, or the team's own command as the run recorded it."""
    if run.command:
        return shlex.split(run.command)
    return [sys.executable, str(WORKLOAD), "--work-dir", str(work_dir)]


def verify_arguments(run: DrillRun) -> list[str]:
    if run.verify_command:
        return shlex.split(run.verify_command)
    return [sys.executable, str(WORKLOAD), "--verify", "-"]


def _sandbox_job(run: DrillRun) -> tuple[Job, str]:
    name = f"drill-{run.scenario}-{run.pk}"
    created = create_job(run.team.name, name)
    Job.objects.filter(pk=created.job.pk).update(drill_sandbox=True)
    DrillRun.objects.filter(pk=run.pk).update(job=created.job)
    run.job = created.job
    return created.job, created.raw_token


def _drive(
    run: DrillRun, scenario: Scenario, job: Job, sandbox: Sandbox
) -> tuple[Facts, dict[str, Any]]:
    # Importing torch and stepping on a loaded machine: generous. Said every little while, so
    # a workload that cannot reach the console does not look like a runner that hung.
    deadline = time.monotonic() + 300
    stepping = None
    while not stepping and time.monotonic() < deadline:
        stepping = wait_until(
            lambda: Job.objects.filter(pk=job.pk, current_step__gte=WARM_UP_STEPS).exists(),
            f"{WARM_UP_STEPS} steps of the workload",
            timeout=min(WARM_UP_PROGRESS_SECONDS, deadline - time.monotonic()),
            sandbox=sandbox,
        )
        if not stepping:
            step = Job.objects.filter(pk=job.pk).values_list("current_step", flat=True).first()
            seen = f"at step {step}" if step is not None else "no heartbeat or metric yet"
            waited = 300 - max(0.0, deadline - time.monotonic())
            _say(run, f"waiting for step {WARM_UP_STEPS} of the workload ({seen}, {waited:.0f} s)")
    if not stepping:
        raise DrillError(f"the workload never reached step {WARM_UP_STEPS}: {sandbox.tail()}")
    return _observe(run, scenario, job, sandbox)


def _observe(
    run: DrillRun, scenario: Scenario, job: Job, sandbox: Sandbox
) -> tuple[Facts, dict[str, Any]]:
    forgiven_before = forgiven_so_far()
    point = _inject(run, scenario, job, sandbox)
    _stage(run, "fault fired")
    alert = _wait_for_alert(job, scenario, forgiven_before)
    _stage(run, "alert seen")
    facts = Facts(fault_step=point.step, forgiven_s=forgiven_so_far() - forgiven_before)
    brake = _wait_for_outcome(job, scenario, alert, sandbox)
    facts.forgiven_to_stop_s = forgiven_so_far() - forgiven_before - facts.forgiven_s
    facts.heartbeat_timeout_s = heartbeat_timeout_seconds(Job.objects.get(pk=job.pk))
    facts.stop_after_s = _stop_after_seconds()
    facts.alert = _alert_facts(alert, point) if alert else None
    facts.rule = _rule_in_force(run, alert.rule_key) if alert else None
    facts.brake = _brake_facts(brake, alert, point) if brake else None
    facts.release = _release_facts(job, sandbox, alert, brake)
    _stage(run, "braked, released")
    if scenario.release == RECOVERS:
        facts.recovery = recovery_facts(job, brake, point, wait_until)
        _stage(run, f"recovery {(facts.recovery or {}).get('status', 'not recorded')}")
    _after_the_brake(run, job, sandbox, facts, alert, brake, point)
    figures = {
        "fault_step": point.step,
        "detect_seconds": (facts.alert or {}).get("detect_s"),
        "brake_seconds": (facts.brake or {}).get("brake_s"),
        "brake_steps": (facts.brake or {}).get("steps"),
    }
    return facts, figures


def _inject(run: DrillRun, scenario: Scenario, job: Job, sandbox: Sandbox) -> StoredPoint:
    """Asks the sandbox for the fault a few steps ahead; returns its first point."""
    step = Job.objects.get(pk=job.pk).current_step or 0
    _stage(run, "stepping")
    params = {"fault": scenario.fault, "at_step": step + FAULT_MARGIN_STEPS, **scenario.params}
    injected = issue_command(
        job.pk,
        CommandKind.INJECT_FAULT,
        reason=f"fire drill #{run.pk}: {scenario.name}",
        actor_kind=ActorKind.PERSON if run.requested_by_id else ActorKind.SYSTEM,
        actor=run.requested_by,
        params=params,
        idempotency_key=f"drill:{run.pk}:inject",
    ).command
    point = wait_until(lambda: _fault_point(job, injected), "the fault", 60, sandbox)
    if point is None:
        injected.refresh_from_db()
        raise DrillError(
            f"the fault never fired (inject_fault {injected.status}: "
            f"{injected.error or 'no answer'})"
        )
    return point


def _after_the_brake(
    run: DrillRun,
    job: Job,
    sandbox: Sandbox,
    facts: Facts,
    alert: Alert | None,
    brake: Command | None,
    point: StoredPoint,
) -> None:
    """The checkpoint, whether it loads, the paging, the timeline and the shadow rules."""
    # A recovery's roll back target: what the catalogue offered first at the brake (the resumed
    # run's later checkpoints are clean too, and would be offered first by now).
    facts.checkpoint = checkpoint_facts(job, brake, (facts.recovery or {}).get("checkpoint_id"))
    if facts.checkpoint is not None:
        # Started only now, after the brake: nine verifiers importing torch while the faults
        # fired took the CPU the rules and the sandboxes needed, and stretched the very
        # detection and brake times being measured (a NaN seen after 10.6 s instead of ~2 s).
        verifier = start_verifier(verify_arguments(run), sandbox.work_dir)
        facts.loads = _loads(verifier, facts.checkpoint, run.corrupt_checkpoint)
    _stage(run, "loads checked")
    if alert is not None:
        facts.paging = paging_facts(job, alert, wait_until)
        facts.timeline = _timeline_kinds(alert)
    facts.shadow = [
        {**firing, "after_s": _seconds_after(firing.pop("fired_at"), point)}
        for firing in would_have_fired(job.pk)
    ]


def _fault_point(job: Job, injected: Command) -> StoredPoint | bool | None:
    point = first_point(job.pk, FAULT_METRIC)
    if point is not None:
        return point
    injected.refresh_from_db()
    if injected.status == CommandStatus.FAILED:
        raise DrillError(f"the sandbox refused the fault: {injected.error}")
    return None


# The longest the wait for the alert stretches for the console's own deafness meanwhile.
FORGIVEN_WAIT_AT_MOST_SECONDS = 120.0


def _wait_for_alert(job: Job, scenario: Scenario, forgiven_before: float) -> Alert | None:
    """Waits past any rule's budget, so a late alert is scored late rather than missed; and as
    much longer as the console forgave its own deafness meanwhile, since the watchdog's
    deadlines moved by as much (up to FORGIVEN_WAIT_AT_MOST_SECONDS)."""
    base = heartbeat_timeout_seconds(Job.objects.get(pk=job.pk)) + DETECT_MARGIN_SECONDS + 40
    alerts = Alert.objects.filter(job=job).order_by("raised_at", "pk")
    started, budget = time.monotonic(), base
    while True:
        left = budget - (time.monotonic() - started)
        expected = wait_until(lambda: alerts.filter(rule_key__in=scenario.rules).first(), "", left)
        if expected:
            return expected
        forgiven = forgiven_so_far() - forgiven_before
        longer = base + min(forgiven, FORGIVEN_WAIT_AT_MOST_SECONDS)
        if longer <= budget:
            return alerts.first()  # what fired instead, if anything did
        budget = longer


def _rule_in_force(run: DrillRun, rule_key: str) -> dict[str, Any] | None:
    """The answering rule as the drill's rule-set version holds it (its own delay sets the
    detection budget); None for the watchdog's rule, which is no rule row."""
    if run.ruleset_version is None:
        return None  # no version recorded to read the rule from: judged by the margin alone
    version = RuleSetVersion.objects.filter(team_id=run.team_id, number=run.ruleset_version)
    snapshot = version.values_list("snapshot", flat=True).first() or {}
    return (snapshot.get("rules") or {}).get(rule_key)


def _brake_command(job: Job, alert: Alert | None) -> Command | None:
    kinds = (CommandKind.CHECKPOINT_AND_PAUSE, CommandKind.TERMINATE)
    commands = Command.objects.filter(job=job, kind__in=kinds).order_by("pk")
    if alert is not None:
        commands = commands.filter(alert=alert)
    return commands.first()


def _wait_for_outcome(
    job: Job, scenario: Scenario, alert: Alert | None, sandbox: Sandbox
) -> Command | None:
    """The brake taking effect as the level says: acknowledged and held, exited, or stopped
    from outside by the executor (after the acknowledgement deadline)."""
    if alert is None:
        return None
    if scenario.release == "stopped":
        timeout = _stop_after_seconds() + 60
        wait_until(lambda: _executor_entry(alert) is not None, "the executor's stop", timeout)
        return _brake_command(job, alert)
    done = (CommandStatus.SUCCEEDED, CommandStatus.FAILED)

    def braked() -> Command | None:
        command = _brake_command(job, alert)
        if command is None or command.status not in done:
            return None
        if scenario.release == "exits":
            return command if sandbox.exit_code() is not None else None
        if scenario.release == RECOVERS:
            return command  # paused for a moment only: the recovery resumes it
        held = Job.objects.filter(pk=job.pk, status=JobStatus.PAUSED).exists()
        return command if held else None

    return wait_until(braked, "the brake", scenario.brake_seconds + 45) or _brake_command(
        job, alert
    )


def _stop_after_seconds() -> float:
    """From the brake of a hung job to the executor's forced stop, at the latest."""
    acknowledge = float(settings.COMMAND_ACK_TIMEOUT_SECONDS["checkpoint_and_pause"])
    return acknowledge + float(settings.EXECUTOR_GRACE_SECONDS)


def _seconds_after(when, point: StoredPoint) -> float:
    return (when - point.time).total_seconds()


def _alert_facts(alert: Alert, point: StoredPoint) -> dict[str, Any]:
    return {
        "rule_key": alert.rule_key,
        "severity": alert.severity,
        "detect_s": _seconds_after(alert.raised_at, point),
        "first_step": alert.first_step,
        "step": alert.step,
    }


def _brake_facts(command: Command, alert: Alert | None, point: StoredPoint) -> dict[str, Any]:
    facts: dict[str, Any] = {"kind": command.kind, "status": command.status, "steps": None}
    facts["error"] = command.error
    entry = _executor_entry(alert) if alert is not None else None
    if entry is not None:  # stopped from outside: braked when the executor stopped it
        facts.update(brake_s=_seconds_after(entry.at, point), status="stopped by the executor")
    elif command.acknowledged_at is not None:
        facts["brake_s"] = _seconds_after(command.acknowledged_at, point)
        step = command.result.get("step")
        facts["steps"] = step - point.step if isinstance(step, int) else None
    return facts


def _executor_entry(alert: Alert) -> TimelineEntry | None:
    if alert.incident_id is None:
        return None
    entries = TimelineEntry.objects.filter(
        incident_id=alert.incident_id, kind=TimelineKind.TERMINATED, data__has_key="executor"
    )
    return entries.order_by("at").first()


def _executor_note(alert: Alert) -> str:
    """What the executor said when it could not stop the job (a refusal, a failed signal)."""
    if alert.incident_id is None:
        return ""
    notes = TimelineEntry.objects.filter(
        incident_id=alert.incident_id, kind=TimelineKind.NOTE, data__has_key="executor"
    )
    note = notes.order_by("at").first()
    return note.message if note is not None else ""


def _release_facts(
    job: Job, sandbox: Sandbox, alert: Alert | None, brake: Command | None = None
) -> dict[str, Any]:
    time.sleep(0.5)  # a holding process must still be holding a moment later
    if _must_release(brake):
        # The SDK releases once it has the console's answer to its ack, which the console
        # committed (and the drill saw) before: on a loaded machine that answer takes a while.
        wait_until(lambda: _release_hooks_run(sandbox.work_dir), "the release", RELEASE_WAIT)
    job.refresh_from_db()
    entry = _executor_entry(alert) if alert is not None else None
    refused = _executor_note(alert) if alert is not None and entry is None else ""
    return {
        "job_status": job.status,
        "alive": sandbox.alive(),
        "exit_code": sandbox.exit_code(),
        "release_hook": _release_hooks_run(sandbox.work_dir) > 0,
        "executor_stopped": entry is not None,
        "executor_detail": entry.message if entry is not None else refused,
    }


def _must_release(brake: Command | None) -> bool:
    """A confirmed checkpoint_and_pause: the process releases its accelerators after it."""
    if brake is None:
        return False
    return (
        brake.kind == CommandKind.CHECKPOINT_AND_PAUSE and brake.status == CommandStatus.SUCCEEDED
    )


def _release_hooks_run(work_dir: Path) -> int:
    """How many release hooks the SDK ran (its note in the sandbox's folder; 0 without one)."""
    try:
        return int((work_dir / RELEASE_MARKER).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def start_verifier(arguments: list[str], work_dir: Path) -> subprocess.Popen:
    """The fresh process of the "loads" line: it has never seen the sandbox, and holds no
    token (only the allowlisted environment)."""
    return subprocess.Popen(
        sandboxed(arguments),
        cwd=work_dir,
        env={**base_environment(), "TRAIN_DIR": str(work_dir)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _loads(verifier: subprocess.Popen, checkpoint: dict[str, Any], corrupt: bool) -> dict:
    """Restore in the fresh process (hash checked first), run one step: the workload's
    ``--verify``. ``corrupt``: the checker's own test — damage the file first."""
    path = Path(checkpoint["path"])
    if corrupt and path.is_file():
        data = bytearray(path.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
        path.write_bytes(bytes(data))
    named: str | None = json.dumps({"path": str(path), "sha256": checkpoint["sha256"]}) + "\n"
    deadline = time.monotonic() + 180
    while True:  # in short slices: a stopped runner does not wait the 180 s out
        try:
            stdout, stderr = verifier.communicate(named, timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            named = None  # sent already (communicate keeps it, and what was read, on a retry)
            if _cancelled() or time.monotonic() > deadline:
                verifier.kill()
                verifier.communicate()
                if _cancelled():
                    raise DrillCancelled(STOPPED) from None
                return {"loads": False, "error": "the fresh process did not finish within 180 s"}
    lines = stdout.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else {"loads": False, "error": stderr[-500:]}
    except json.JSONDecodeError:
        return {"loads": False, "error": (stdout + stderr)[-500:]}


def _timeline_kinds(alert: Alert) -> list[str]:
    if alert.incident_id is None:
        return []
    entries = TimelineEntry.objects.filter(incident_id=alert.incident_id).order_by("at", "pk")
    return list(entries.values_list("kind", flat=True))


def _clean_up(run: DrillRun, sandbox: Sandbox) -> None:
    """End the sandbox (terminate through the console, then the executor), stop the pages.
    The sandbox is stopped whatever happens before (a stopped runner waits less for it)."""
    try:
        job = run.job
        if job is not None:
            _drill_over(run, job)
            if sandbox.alive():
                # A job that takes no terminate any more: the executor ends it below.
                with contextlib.suppress(ServiceError):
                    reason = f"fire drill #{run.pk} over"
                    issue_command(job.pk, CommandKind.TERMINATE, reason=reason)
                grace = CANCELLED_GRACE_SECONDS if _cancelled() else 20
                # Not cancellable: this is the one wait a stopped runner still makes.
                wait_until(lambda: not sandbox.alive(), "its end", grace, cancellable=False)
    finally:
        sandbox.stop()
        if run.job is not None:
            _drill_over(run, run.job)  # and what the sandbox's last moments raised
    log.info("drill #%s (%s) cleaned up at %s", run.pk, run.scenario, timezone.now())


def _drill_over(run: DrillRun, job: Job) -> None:
    """The drill's alerts stop paging and are resolved: its scorecard is written, its sandbox
    ends. One still firing would stay on the board, and a console that lost its dispatch (a
    restart) would page for it later, long after the drill."""
    for alert_id in Alert.objects.filter(job=job).values_list("pk", flat=True):
        stop_notifications(alert_id)
        resolve_alert(alert_id, reason=f"fire drill #{run.pk} over: its sandbox ended")
