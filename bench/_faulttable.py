"""The fault suite's counts and its table (bench/faults.py): what the fault stack stored,
counted per job against what the clients logged, and the columns that must be zero."""

from __future__ import annotations

from bench._faultjobs import Fault, Scenario
from bench._faultstack import Stack


def hung_alerts(stack: Stack, scenario: Scenario) -> int:
    return stack.sql(
        "SELECT count(*) FROM incidents_alert WHERE job_id = %s AND rule_key = %s",
        (scenario.hung.job_id, "heartbeat-timeout"),
    )[0][0]


FAILED_BRAKE_RULE = "brake-checkpoint-failed"  # incidents.notifications.grouping


def failed_brake_pages(stack: Stack, scenario: Scenario) -> int:
    """Pages delivered for the NaN job's failed-brake alert."""
    return stack.sql(
        "SELECT count(*) FROM incidents_delivery d JOIN incidents_alert a ON a.id = d.alert_id "
        "WHERE a.job_id = %s AND a.rule_key = %s AND d.status IN ('sent', 'delivered')",
        (scenario.nan_during.job_id, FAILED_BRAKE_RULE),
    )[0][0]


def hung_deadline(stack: Stack, scenario: Scenario) -> float | None:
    """The hung job's deadline as its alert says (last heartbeat + timeout, epoch seconds)."""
    rows = stack.sql(
        "SELECT extract(epoch FROM first_time) + threshold FROM incidents_alert "
        "WHERE job_id = %s AND rule_key = %s ORDER BY id LIMIT 1",
        (scenario.hung.job_id, "heartbeat-timeout"),
    )
    return float(rows[0][0]) if rows else None


def hung_late(stack: Stack, scenario: Scenario) -> float | None:
    """Seconds from the hung job's deadline to its alert."""
    rows = stack.sql(
        "SELECT extract(epoch FROM raised_at - first_time) - threshold FROM incidents_alert "
        "WHERE job_id = %s AND rule_key = %s ORDER BY id LIMIT 1",
        (scenario.hung.job_id, "heartbeat-timeout"),
    )
    return float(rows[0][0]) if rows else None


def _ids(scenario: Scenario) -> list[int]:
    return [job.job_id for job in scenario.jobs]


def pending_pages(stack: Stack, scenario: Scenario) -> int:
    """Pages still owed: queued deliveries, and alerts not dispatched at all yet."""
    return stack.sql(
        "SELECT (SELECT count(*) FROM incidents_delivery d JOIN incidents_alert a ON "
        "a.id = d.alert_id WHERE a.job_id = ANY(%s) AND d.status = 'queued') + (SELECT count(*) "
        "FROM incidents_alert a WHERE a.job_id = ANY(%s) AND a.layer <> 'performance' AND NOT "
        "EXISTS (SELECT 1 FROM incidents_delivery d WHERE d.alert_id = a.id))",
        (_ids(scenario), _ids(scenario)),
    )[0][0]


def _points(stack: Stack, scenario: Scenario) -> tuple[int, int]:
    """(lost, duplicated): per job, the steps its client logged against the points stored."""
    rows = stack.sql(
        "SELECT j.id, count(*), count(DISTINCT p.step) FROM unnest(%s::bigint[]) AS j(id) "
        "CROSS JOIN LATERAL brakeline_points(j.id, 'loss', 0, 9223372036854775807) AS p "
        "GROUP BY j.id",
        (_ids(scenario),),
    )
    stored = {job_id: (total, distinct) for job_id, total, distinct in rows}
    lost = duplicated = 0
    for job in scenario.jobs:
        total, distinct = stored.get(job.job_id, (0, 0))
        lost += len(set(job.logged)) - distinct
        duplicated += total - distinct
    return lost, duplicated


def _commands(stack: Stack, scenario: Scenario) -> dict[int, int]:
    """Commands per job."""
    return dict(
        stack.sql(
            "SELECT job_id, count(*) FROM breakers_command WHERE job_id = ANY(%s) GROUP BY job_id",
            (_ids(scenario),),
        )
    )


def _alerts(stack: Stack, scenario: Scenario) -> tuple[int, list[str]]:
    """(rules alerted more than once on a job, "job: rule — description" of each alert no
    scenario asked for)."""
    ids = _ids(scenario)
    doubled = stack.sql(
        "SELECT count(*) FROM (SELECT job_id, rule_key FROM incidents_alert WHERE job_id = ANY(%s)"
        " GROUP BY job_id, rule_key HAVING count(*) > 1) doubled",
        (ids,),
    )[0][0]
    # Alerts no scenario asked for: any rule on a healthy job, any other rule on the others.
    nan_during = {"non-finite-loss-or-gradients"}
    if scenario.nan_during.checkpoint_fails:
        nan_during.add(FAILED_BRAKE_RULE)
    expected = {
        scenario.nan_during.job_id: nan_during,
        scenario.nan_after.job_id: {"non-finite-loss-or-gradients"},
        scenario.hung.job_id: {"heartbeat-timeout"},
    }
    alerts = stack.sql(
        "SELECT job_id, rule_key, description FROM incidents_alert WHERE job_id = ANY(%s)",
        (ids,),
    )
    names = {job.job_id: job.name for job in scenario.jobs}
    return doubled, [
        f"{names[job_id]}: {rule} — {description}"
        for job_id, rule, description in alerts
        if rule not in expected.get(job_id, set())
    ]


def _pages(stack: Stack, scenario: Scenario) -> dict[str, int]:
    """The page columns: stored deliveries against what the fake provider received."""
    ids = _ids(scenario)
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
    keys = stack.provider.pages()
    unsent = [p for p in pages if p[1] not in ("sent", "delivered")]
    undelivered = sum(1 for p in pages if keys.get(f"brakeline-delivery-{p[0]}", 0) == 0)
    return {
        "pages": len(pages),
        "pages_missed": len(unsent) + undelivered + unpaged,
        "pages_doubled": len(pages) - len({(p[2], p[3], p[4]) for p in pages}),
        "pages_resent": sum(1 for p in pages if keys.get(f"brakeline-delivery-{p[0]}", 0) > 1),
    }


def _health_red(scenario: Scenario) -> bool | None:
    """Whether /api/v1/health answered anything but 200 while the part was down (None: it was
    never asked then)."""
    began, ended = scenario.fault_started or 0.0, scenario.fault_ended or 0.0
    down = [status for at, status in scenario.health if began <= at <= ended]
    return any(status != 200 for status in down) if down else None


def measure(stack: Stack, scenario: Scenario, recovered: float | None) -> dict:
    lost, duplicated = _points(stack, scenario)
    commands = _commands(stack, scenario)
    nan_jobs = [scenario.nan_during, scenario.nan_after]
    alerts_doubled, other = _alerts(stack, scenario)
    return {
        "brake_during": scenario.nan_during.brake_latency,
        "brake_after": scenario.nan_after.brake_latency,
        "recover": recovered,
        "lost": lost,
        "duplicated": duplicated,
        "nan_missed": sum(1 for job in nan_jobs if not job.braked),
        "nan_doubled": sum(1 for job in nan_jobs if commands.get(job.job_id, 0) > 1),
        "hung_missed": 0 if hung_alerts(stack, scenario) else 1,
        "hung_late": hung_late(stack, scenario),
        "failed_brake_pages": failed_brake_pages(stack, scenario),
        "brake_checkpoint_fails": scenario.nan_during.checkpoint_fails,
        "commands_doubled": sum(1 for job in scenario.jobs if commands.get(job.job_id, 0) > 1),
        "false_brakes": sum(
            1
            for job in scenario.jobs
            if job not in (*nan_jobs, scenario.hung) and commands.get(job.job_id, 0)
        ),
        "alerts_doubled": alerts_doubled,
        "other_alerts": len(other),
        "other_alert_texts": other,  # said with the failure: which rule, and why
        **_pages(stack, scenario),
        "health_red": _health_red(scenario),
        "health_green": recovered is not None,
    }


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def table(results: list[tuple[Fault, dict]]) -> str:
    header = (
        f"{'fault':<44} {'brake during':>12} {'after':>6} {'recover':>8} {'lost':>5} "
        f"{'dup':>4} {'missed':>6} {'2x':>3} {'hung':>4} {'late':>5} {'false':>5} {'other':>5} "
        f"{'pages':>5} "
        f"{'p-miss':>6} {'p-2x':>4} {'resent':>6} {'red':>4} {'green':>5} {'overlap':>7}"
    )
    lines = [header, "-" * len(header)]
    for fault, r in results:
        doubled = r["nan_doubled"] + r["commands_doubled"] + r["alerts_doubled"]
        lines.append(
            f"{fault.title:<44} {_seconds(r['brake_during']):>12} {_seconds(r['brake_after']):>6} "
            f"{_seconds(r['recover']):>8} {r['lost']:>5} {r['duplicated']:>4} "
            f"{r['nan_missed']:>6} {doubled:>3} "
            f"{r['hung_missed']:>4} {_seconds(r.get('hung_late')):>5} "
            f"{r['false_brakes']:>5} {r['other_alerts']:>5} "
            f"{r['pages']:>5} {r['pages_missed']:>6} "
            f"{r['pages_doubled']:>4} {r['pages_resent']:>6} "
            f"{'yes' if r['health_red'] else 'NO' if r['health_red'] is False else '—':>4} "
            f"{'yes' if r['health_green'] else 'NO':>5} "
            f"{'NO' if r.get('overlap') else 'yes':>7}"
        )
    lines.append(
        "brake: seconds from the NaN logged to the command in the SDK (during the fault / after "
        "it); recover: seconds from the part's return to a healthy console that braked, "
        "detected and paged everything; missed/2x: NaNs not braked / alerts or commands "
        "doubled; hung: hung jobs missed; late: seconds from "
        "the hung job's deadline to its alert (moved by an outage of the web tier); false: "
        "healthy jobs braked; other: alerts of a rule "
        "the scenario did not provoke (a breakers-failing alert, say); p-miss/p-2x: pages not "
        "delivered / doubled; resent: pages sent again with the same idempotency key "
        "(once for the person); red/green: /api/v1/health while the part was down / after; "
        "overlap: the fault proved it struck what it tests (the NaN's brake crossed it, the "
        "page was held, the deadline fell inside the outage)."
    )
    return "\n".join(lines)
