"""The scorecard: what a drill measured, judged line by line. Pure Python, no Django.

The runner (``breakers.drills.runner``) gathers :class:`Facts` from the console's own records
(alerts, commands, the checkpoint catalogue, deliveries, the incident's timeline) and from the
sandbox process; :func:`score` turns them into lines, each with its measured figure and the
expectation it was held against. A drill passes only when every line passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePath as Path
from typing import Any

from breakers.drills.scenarios import HEARTBEAT_RULE, RECOVERS, Scenario

EXIT_TERMINATED = 75  # the SDK's exit code after terminate (brakeline.EXIT_TERMINATED)


@dataclass(frozen=True)
class Line:
    name: str
    passed: bool
    measured: str
    expectation: str
    detail: str = ""


@dataclass
class Facts:
    """Everything a drill observed, as plain values (times in seconds since the fault)."""

    fault_step: int | None = None
    alert: dict[str, Any] | None = None  # rule_key, severity, detect_s, first_step, step
    heartbeat_timeout_s: float | None = None  # the job's watchdog deadline, for that rule
    # The console's own deafness it forgave between the fault and the alert (its web tier away
    # or holding requests unserved): the watchdog's deadlines ran that much later, by design.
    forgiven_s: float = 0.0
    forgiven_to_stop_s: float = 0.0  # as much again from the alert on: the ack deadline's move
    rule: dict[str, Any] | None = None  # the answering rule as in the drill's rule-set version
    # A hung job is stopped from outside only after its brake's acknowledgement deadline and
    # the executor's grace: part of the expectation of a "stopped" release.
    stop_after_s: float = 0.0
    brake: dict[str, Any] | None = None  # kind, status, brake_s, step, error
    checkpoint: dict[str, Any] | None = None  # catalogue row: step, weights_step, sha256, path
    loads: dict[str, Any] | None = None  # the fresh process's answer
    release: dict[str, Any] = field(default_factory=dict)  # job_status, alive, exit_code, ...
    paging: dict[str, Any] = field(default_factory=dict)  # expected/paged channels, people
    timeline: list[str] = field(default_factory=list)  # the incident's timeline kinds
    # What the team's shadow rules would have done (rule_key, severity, action, fired_step,
    # after_s): listed on the scorecard, never judged.
    shadow: list[dict[str, Any]] = field(default_factory=list)
    # A drill of the recovery path: the verdict, the roll back, training after it
    # (breakers.drills.recovery_facts); None when no verdict was recorded.
    recovery: dict[str, Any] | None = None


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


# The margin on top of a rule's own delay: on a loaded two-core CI machine an evaluation may
# wait seconds for the worker, and a step or two may pass before the point reaches it.
DETECT_MARGIN_SECONDS = 10.0
DETECT_MARGIN_STEPS = 3


@dataclass(frozen=True)
class Budget:
    seconds: float
    steps: int
    why: str  # "rule R's 2.0 s, 4 steps + 10 s, 3 steps margin"

    def expectation(self) -> str:
        return f"≤ {self.seconds:.1f} s and ≤ {self.steps} steps after the fault: {self.why}"


def rule_delay(
    rule_key: str, rule: Mapping[str, Any] | None, heartbeat_timeout_s: float | None
) -> tuple[float, int]:
    """How long the rule itself waits before it fires, in seconds and steps: the watchdog's
    deadline for ``heartbeat-timeout``; else what its parameters ask the condition to last
    (``sustain_seconds``/``sustain_points``, a ``rising`` detector's windows, a
    ``window_seconds``). A rule that fires on its first point waits nothing."""
    if rule_key == HEARTBEAT_RULE:
        return float(heartbeat_timeout_s or 0.0), 0
    params = (rule or {}).get("params") or {}
    seconds = float(params.get("sustain_seconds") or 0.0) + float(
        params.get("window_seconds") or 0.0
    )
    steps = max(0, int(params.get("sustain_points") or 1) - 1)
    if (rule or {}).get("detector") == "rising":
        steps += int(params.get("window") or 0) * int(params.get("windows") or 0)
    return seconds, steps


def detect_budget(
    rule_key: str | None,
    rule: Mapping[str, Any] | None,
    heartbeat_timeout_s: float | None,
    forgiven_s: float = 0.0,
) -> Budget:
    """The expectation of "time to detect": the answering rule's own delay, read from the
    team's rules in force (the drill's rule-set version), plus the loaded-machine margin. The
    watchdog's deadline also runs later by the deafness the console forgave meanwhile: a
    silence the console could not hear is not the job's."""
    if rule_key is None:
        return Budget(DETECT_MARGIN_SECONDS, DETECT_MARGIN_STEPS, "no rule answered")
    seconds, steps = rule_delay(rule_key, rule, heartbeat_timeout_s)
    own = "the watchdog's deadline" if rule_key == HEARTBEAT_RULE else f"rule {rule_key}'s"
    why = f"{own} {seconds:.1f} s, {steps} steps"
    if rule_key == HEARTBEAT_RULE and forgiven_s > 0:
        seconds += forgiven_s
        why += f" + {forgiven_s:.1f} s the console forgave (its own deafness)"
    why += f" + {DETECT_MARGIN_SECONDS:g} s, {DETECT_MARGIN_STEPS} steps margin"
    return Budget(seconds + DETECT_MARGIN_SECONDS, steps + DETECT_MARGIN_STEPS, why)


def _detect_budget(facts: Facts) -> Budget:
    key = (facts.alert or {}).get("rule_key")
    return detect_budget(key, facts.rule, facts.heartbeat_timeout_s, facts.forgiven_s)


def fired_line(scenario: Scenario, facts: Facts) -> Line:
    expected = f"{scenario.level} by {' or '.join(scenario.rules)}"
    alert = facts.alert
    if alert is None:
        return Line("breaker fired", False, "no alert after the fault", expected)
    ok = alert["severity"] == scenario.level and alert["rule_key"] in scenario.rules
    return Line("breaker fired", ok, f"{alert['severity']} by {alert['rule_key']}", expected)


def detect_line(scenario: Scenario, facts: Facts) -> Line:
    budget = _detect_budget(facts)
    expected = budget.expectation()
    alert = facts.alert
    if alert is None or facts.fault_step is None:
        return Line("time to detect", False, "not detected", expected)
    steps = max(0, alert["first_step"] - facts.fault_step)
    ok = alert["detect_s"] <= budget.seconds and steps <= budget.steps
    return Line("time to detect", ok, f"{_s(alert['detect_s'])}, {steps} steps", expected)


def brake_line(scenario: Scenario, facts: Facts) -> Line:
    detect = _detect_budget(facts)
    budget = detect.seconds + scenario.brake_seconds
    why = f"the detection's {detect.seconds:.1f} s + {scenario.brake_seconds:g} s to brake"
    if scenario.release == "stopped":
        budget += facts.stop_after_s + facts.forgiven_to_stop_s
        why += f" + {facts.stop_after_s:g} s acknowledgement deadline and grace"
        if facts.forgiven_to_stop_s > 0:
            why += f" + {facts.forgiven_to_stop_s:.1f} s the console forgave"
    expected = f"braked ≤ {budget:.1f} s after the fault: {why}"
    brake = facts.brake
    if brake is None or brake.get("brake_s") is None:
        why = "no brake command" if brake is None else f"{brake['kind']} {brake['status']}"
        return Line("time to brake", False, why, expected, (brake or {}).get("error", ""))
    steps = "—" if brake.get("steps") is None else f"{brake['steps']} steps"
    ok = brake["brake_s"] <= budget
    measured = f"{_s(brake['brake_s'])}, {steps} ({brake['kind']} {brake['status']})"
    return Line("time to brake", ok, measured, expected, brake.get("error", ""))


def checkpoint_lines(scenario: Scenario, facts: Facts) -> list[Line]:
    row, fault = facts.checkpoint, facts.fault_step
    if row is None:
        missing = "none in the catalogue"
        return [
            Line("checkpoint saved", False, missing, "a checkpoint to restart from"),
            Line("checkpoint loads", False, "nothing to load", "restored in a fresh process"),
            Line("checkpoint before the anomaly", False, missing, "no update from the fault on"),
        ]
    through = row["weights_step"] if row.get("weights_step") is not None else row["step"]
    saved = _saved_line(scenario, facts, row)
    loads = facts.loads if isinstance(facts.loads, dict) else {}
    error = str(loads.get("error", "no answer"))
    loaded = Line(
        "checkpoint loads",
        loads.get("loads") is True,
        _loaded(loads)
        if loads.get("loads") is True
        else "did not load: " + error.replace(row["path"], Path(row["path"]).name),
        "restored in a fresh process, SHA-256 verified, one step runs",
        "" if loads.get("loads") else error,
    )
    if scenario.poisons_weights:
        ok, rule = fault is not None and through < fault, f"weights through < step {fault}"
    else:
        ok, rule = fault is not None and through <= fault, f"weights through ≤ step {fault}"
    before = Line("checkpoint before the anomaly", ok, f"weights through step {through}", rule)
    return [saved, loaded, before]


def _saved_line(scenario: Scenario, facts: Facts, row: dict[str, Any]) -> Line:
    measured = f"step {row['step']} ({row['reason']}), in the catalogue"
    expected = "a checkpoint to restart from, in the catalogue"
    detail = f"{row['path']} sha256 {row['sha256']}"
    if scenario.brake_saves:
        return Line("checkpoint saved", True, measured, expected, detail)
    # The brake's save was meant to fail: it must say so, and have saved nothing.
    brake = facts.brake or {}
    failed = brake.get("status") == "failed" and not row.get("brake_saved")
    said = brake.get("error") or "no error reported"
    measured = f"the brake saved none ({said[:80]}); {measured}"
    expected = "the brake's save failed and saved nothing; " + expected
    return Line("checkpoint saved", failed, measured, expected, detail)


def _loaded(answer: dict[str, Any]) -> str:
    """The verify process's answer in words (a team's own may leave out step or loss)."""
    step, loss = answer.get("step"), answer.get("loss")
    said = f"restored step {step}" if isinstance(step, int) else "restored"
    if isinstance(loss, int | float) and not isinstance(loss, bool):
        return f"{said}, one step ran (loss {loss:.4g})"
    return f"{said}, one step ran"


def release_line(scenario: Scenario, facts: Facts) -> Line:
    r = facts.release
    if scenario.release == "holds" and not scenario.brake_saves:
        # No confirmed checkpoint: freeing the accelerators would lose the state.
        ok = r.get("job_status") == "paused" and r.get("alive") and not r.get("release_hook")
        expected = "paused, process alive and holding, release hook NOT run (nothing saved)"
        measured = (
            f"job {r.get('job_status')}, process {'alive' if r.get('alive') else 'gone'}, "
            f"release hook {'ran' if r.get('release_hook') else 'did not run'}"
        )
    elif scenario.release == "holds":
        ok = r.get("job_status") == "paused" and r.get("alive") and r.get("release_hook")
        expected = "paused, process alive and holding, release hook ran"
        measured = (
            f"job {r.get('job_status')}, process {'alive' if r.get('alive') else 'gone'}, "
            f"release hook {'ran' if r.get('release_hook') else 'did not run'}"
        )
    elif scenario.release == RECOVERS:
        # Freed after the confirmed brake, before the roll back; the status is the recovery's.
        ok = r.get("alive") and r.get("release_hook")
        expected = "process alive, release hook ran after the confirmed brake"
        measured = (
            f"process {'alive' if r.get('alive') else 'gone'}, "
            f"release hook {'ran' if r.get('release_hook') else 'did not run'}"
        )
    elif scenario.release == "exits":
        ok = r.get("exit_code") == EXIT_TERMINATED and r.get("job_status") == "terminated"
        expected = f"terminated, process exited {EXIT_TERMINATED}"
        measured = f"job {r.get('job_status')}, exit code {r.get('exit_code')}"
    else:
        ok = bool(r.get("executor_stopped")) and not r.get("alive")
        expected = "stopped by the executor, on the timeline"
        measured = f"executor: {r.get('executor_detail') or 'did not act'}"
    return Line("release", bool(ok), measured, expected, r.get("detail", ""))


def paging_line(facts: Facts) -> Line:
    p = facts.paging
    expected_channels = sorted(p.get("expected_channels", []))
    if p.get("receivers"):
        who = "the team's drill receivers"
    elif p.get("on_call", True):
        who = "the on-call person"
    else:  # round 0 with nobody on call pages the managers: say so, or it reads as a mix-up
        who = "the managers (nobody on call)"
    expected = (
        f"{', '.join(expected_channels) or 'no channel'} to {who} ({p.get('expected_people')})"
    )
    if not p.get("policy"):
        return Line("paged", False, "the team has no notification policy", expected)
    paged = sorted(p.get("paged_channels", []))
    ok = (
        bool(expected_channels)
        and paged == expected_channels
        and p.get("people_ok", False)
        and p.get("all_marked_drill", False)
        and not p.get("failed")
    )
    measured = (
        f"{', '.join(paged) or 'nothing'} to {p.get('paged_people')}"
        f"{'' if p.get('all_marked_drill') else ', NOT marked as a drill'}"
        f"{', failed: ' + ', '.join(p['failed']) if p.get('failed') else ''}"
    )
    return Line("paged", ok, measured, expected + ", marked DRILL", p.get("detail", ""))


def timeline_line(scenario: Scenario, facts: Facts) -> Line:
    needed = ["first_anomalous_point", "alert_raised", "command_issued", "notification"]
    if scenario.release in ("holds", RECOVERS):
        needed += ["command_acknowledged"] + (["checkpoint_saved"] if scenario.brake_saves else [])
    elif scenario.release == "exits":
        needed += ["command_acknowledged", "terminated"]
    else:
        needed += ["terminated"]
    kinds = set(facts.timeline)
    if kinds & {"notification_sent", "notification_delivered"}:
        kinds.add("notification")
    missing = [kind for kind in needed if kind not in kinds]
    measured = f"{len(facts.timeline)} rows" + (
        f", missing {', '.join(missing)}" if missing else ""
    )
    detail = " → ".join(facts.timeline)
    return Line("timeline complete", not missing, measured, ", ".join(needed), detail)


def shadow_line(facts: Facts) -> Line:
    """What the shadow rules would have done during the drill. Observed, never judged: a shadow
    rule acts on nothing, so no part of the drill depends on it (the line always passes)."""
    parts = [
        f"{s['rule_key']}: {s['severity']} {s['action']} at step {s['fired_step']}, "
        f"{_s(s['after_s'])} after the fault"
        for s in facts.shadow
    ]
    measured = f"{len(parts)} would have fired"
    return Line("shadow rules", True, measured, "observed only, not judged", "; ".join(parts))


# From the brake to the recovery's end on a loaded two-core machine: the verdict's task, the
# roll back's command reaching the held job, the restore (hash checked first), the answer.
# About a second alone; 36–50 s in a full drill set on an overloaded machine, where the
# verdict's task waits behind the other sandboxes' rule evaluations on the same worker.
RECOVER_SECONDS = 60.0
RESUMED_STEPS = 10  # breakers.drills.recovery_facts.RESUMED_STEPS


def recovery_lines(scenario: Scenario, facts: Facts) -> list[Line]:
    """A drill of the recovery path: the verdict recorded before acting, the roll back to the
    clean checkpoint on the drill's own sandbox, the poisoned step skipped, training resumed,
    and the time it all took."""
    r = facts.recovery
    if r is None:
        why = "no verdict recorded for the brake"
        return [
            Line("verdict recorded", False, why, "RECOVER, recorded before the system acts"),
            Line("rolled back", False, why, "to the last clean checkpoint"),
            Line("step skipped", False, why, "the poisoned step's batch never trained on again"),
            Line("resumed", False, why, f"training again, ≥ {RESUMED_STEPS} healthy steps"),
            Line("time to recover", False, why, "recovered"),
        ]
    return [
        _verdict_line(r),
        _rolled_back_line(r, facts.fault_step),
        _skipped_line(r, facts.fault_step),
        _resumed_line(r),
        _recover_time_line(scenario, facts, r),
    ]


def _verdict_line(r: dict[str, Any]) -> Line:
    ok = r["verdict"] == "recover" and r["recorded_first"]
    first = "before" if r["recorded_first"] else "NOT before"
    measured = f"{r['verdict'].upper()} ({r['status']}), {_s(r['decided_s'])} after the fault"
    measured += f", recorded {first} the roll back"
    expected = "RECOVER, recorded (with its reasons) before the system acts on it"
    return Line("verdict recorded", ok, measured, expected, "; ".join(r["reasons"]))


def _rolled_back_line(r: dict[str, Any], fault_step: int | None) -> Line:
    resume = r.get("resume") or {}
    own = r["recovery_job"] == r["sandbox_job"] and r["resume_job"] in (None, r["sandbox_job"])
    clean = fault_step is not None and r["weights_step"] is not None
    clean = clean and r["weights_step"] < fault_step
    ok = (
        own
        and clean
        and resume.get("rolled_back") is True
        and resume.get("restored_step") == r["checkpoint_step"]
        and resume.get("sha256_matches") is True
    )
    where = f"on job {r['resume_job'] or r['recovery_job']} (the sandbox is {r['sandbox_job']})"
    if not resume:
        measured = f"no roll back sent ({r['status']})"
    elif resume.get("rolled_back"):
        matches = resume.get("sha256_matches")
        checked = "sha256 verified" if matches else "sha256 NOT the catalogue's"
        measured = (
            f"to step {resume.get('restored_step')} (weights through {r['weights_step']}), "
            f"{checked}, {where}"
        )
    else:
        measured = f"resume {resume.get('status')}: {resume.get('error') or 'not rolled back'}"
    expected = (
        f"to the catalogue's last clean checkpoint (weights before step {fault_step}), hash "
        "checked, on the drill's own sandbox job"
    )
    return Line("rolled back", bool(ok), measured, expected)


def _skipped_line(r: dict[str, Any], fault_step: int | None) -> Line:
    restored = (r.get("resume") or {}).get("restored_step")
    weights, skip = r["weights_step"], r["skip_steps"]
    trained_again = ((r.get("resumed") or {}).get("fault_step_losses") or 0) > 1
    if fault_step is None or not isinstance(restored, int) or weights is None:
        how, ok = "not rolled back", False
    elif fault_step in skip:
        how, ok = f"dropped (skip_steps {skip})", True
    elif restored >= fault_step > weights:
        how, ok = f"behind the restored state (step {restored}, without its update)", True
    else:
        how, ok = f"to be trained again (restored step {restored}, skip_steps {skip})", False
    ok = ok and not trained_again
    measured = f"step {fault_step}: {how}" + (", trained on again" if trained_again else "")
    expected = "the poisoned step's batch never trained on again: dropped, or behind the restore"
    return Line("step skipped", ok, measured, expected)


def _resumed_line(r: dict[str, Any]) -> Line:
    resumed = r.get("resumed") or {}
    ok = (
        resumed.get("job_status") == "running"
        and resumed.get("steps", 0) >= RESUMED_STEPS
        and resumed.get("non_finite", 0) == 0
    )
    if not resumed:
        measured = f"not resumed (recovery {r['status']})"
    else:
        bad = resumed.get("non_finite", 0)
        measured = (
            f"job {resumed.get('job_status')}, {resumed.get('steps', 0)} steps trained after it, "
            + ("every loss finite" if not bad else f"{bad} non-finite loss(es)")
        )
    expected = f"running, ≥ {RESUMED_STEPS} steps past the restored one, every loss finite"
    return Line("resumed", ok, measured, expected)


def _recover_time_line(scenario: Scenario, facts: Facts, r: dict[str, Any]) -> Line:
    detect = _detect_budget(facts)
    budget = detect.seconds + scenario.brake_seconds + RECOVER_SECONDS
    expected = (
        f"recovered ≤ {budget:.1f} s after the fault: the brake's {detect.seconds:.1f} + "
        f"{scenario.brake_seconds:g} s, + {RECOVER_SECONDS:g} s to decide, roll back and resume"
    )
    done = r["status"] == "recovered" and r["finished_s"] is not None
    if not done:
        return Line("time to recover", False, f"not recovered ({r['status']})", expected)
    brake_s = (facts.brake or {}).get("brake_s")
    since = "" if brake_s is None else f" ({_s(r['finished_s'] - brake_s)} after the brake)"
    measured = f"{_s(r['finished_s'])}{since}"
    return Line("time to recover", r["finished_s"] <= budget, measured, expected)


def score(scenario: Scenario, facts: Facts) -> list[Line]:
    return [
        fired_line(scenario, facts),
        detect_line(scenario, facts),
        brake_line(scenario, facts),
        *checkpoint_lines(scenario, facts),
        release_line(scenario, facts),
        paging_line(facts),
        timeline_line(scenario, facts),
        *(recovery_lines(scenario, facts) if scenario.release == RECOVERS else []),
        *([shadow_line(facts)] if facts.shadow else []),
    ]
