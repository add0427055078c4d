"""``manage.py drill`` against the real stack: the SDK in a real PyTorch sandbox process,
Daphne, the Celery worker's rules, the beat's watchdog, PostgreSQL, Redis, the notification
senders (the receiver stands in for the chat webhook and the phone provider).

The full drill set of the default pack (``--scenario all``: every scenario, at the same time,
the drill of the automatic recovery path among them) must pass every scorecard line with its
figures; the same drill with its checkpoint damaged on purpose must fail on the "loads" line
and on that line only.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from breakers.drills import workloads
from breakers.drills.scenarios import DRILL_SET, rehearses_recovery
from breakers.models import DrillCheck, DrillRun, DrillStatus
from incidents.models import Alert, Delivery, Job, Recovery
from incidents.notifications.sweep import undispatched_alerts
from tests.support.drills import END_TO_END_MARKS, RECOVERY_LINES, SCORECARD_LINES, drill

pytestmark = END_TO_END_MARKS

LINES = SCORECARD_LINES


def shorten_the_hang_deadline(settings) -> None:
    """The brake's acknowledgement deadline shortened (the worker, in this process, issues and
    expires it): with the default 300 s the executor stops a hung job only after five minutes.
    Still well above what an answering job needs."""
    settings.COMMAND_ACK_TIMEOUT_SECONDS = {
        **settings.COMMAND_ACK_TIMEOUT_SECONDS,
        "checkpoint_and_pause": 20.0,
    }
    settings.EXECUTOR_GRACE_SECONDS = 2.0


def test_the_drill_set_passes_every_line_with_its_figures(
    live_console, drill_team, receiver, settings
):
    shorten_the_hang_deadline(settings)
    started = time.monotonic()
    output, code = drill(live_console, "--scenario", "all")
    print(output, f"\nthe drill set took {time.monotonic() - started:.1f} s")
    runs = list(DrillRun.objects.filter(team=drill_team).order_by("pk"))
    assert [run.scenario for run in runs] == list(DRILL_SET)
    assert code == 0, output
    assert len({run.drill_set for run in runs}) == 1  # one drill set
    for run in runs:
        assert run.status == DrillStatus.PASSED, (run.scenario, run.error, output)
        names = list(run.checks.values_list("name", flat=True))
        assert names == LINES + (RECOVERY_LINES if rehearses_recovery(run.scenario) else [])
        assert run.detect_seconds is not None and run.brake_seconds is not None
        assert 0 < run.detect_seconds <= run.brake_seconds
        assert Job.objects.get(pk=run.job_id).drill_sandbox
        assert f"Drill #{run.pk} {run.scenario}" in output and "PASSED" in output
    by_name = {run.scenario: run for run in runs}
    assert (
        "L3 by heartbeat-timeout"
        in by_name["heartbeat_loss"].checks.get(name="breaker fired").measured
    )
    # The drill of the recovery path recovered its own sandbox, and only it; the others held.
    recovered = Recovery.objects.values_list("job_id", "verdict")
    assert list(recovered) == [(by_name["poisoned_batch"].job_id, "recover")]
    for name in ("xid", "comm_failure"):
        assert "exit code 75" in by_name[name].checks.get(name="release").measured
    # The hang: the whole-job executor signals the one process outside any launcher after its
    # start time was checked; the line passes only once that process is gone.
    hang = by_name["hang"]
    release = hang.checks.get(name="release").measured
    assert "stopping the whole job" in release and "1 rank(s) outside a launcher" in release
    assert "stopped by the executor" in hang.checks.get(name="time to brake").measured
    assert hang.brake_seconds > hang.detect_seconds + 20.0  # not before the deadline expired
    # The pages went out, to real endpoints, and said they were a drill.
    deliveries = Delivery.objects.filter(alert__job__drill_sandbox=True)
    assert deliveries.exists() and set(deliveries.values_list("purpose", flat=True)) == {"drill"}
    chat = receiver.to("/hooks/chat")
    assert chat and all(b"DRILL" in request.body for request in chat)
    # A finished report is kept as judged.
    with pytest.raises(Exception, match="append-only"):
        DrillCheck.objects.filter(run=runs[0]).update(passed=False)


def test_a_corrupted_checkpoint_fails_on_the_loads_line(live_console, drill_team):
    output, code = drill(live_console, "--scenario", "nan_loss", "--corrupt-checkpoint")
    run = DrillRun.objects.get(team=drill_team)
    assert code == 1 and run.status == DrillStatus.FAILED, output
    failed = list(run.checks.filter(passed=False).values_list("name", flat=True))
    assert failed == ["checkpoint loads"], output
    assert "does not match the expected sha256" in run.checks.get(name="checkpoint loads").measured
    # The drill is over: none of its alerts stays on the board, nor pages after a restart.
    alerts = Alert.objects.filter(job_id=run.job_id)
    assert alerts.exists() and not alerts.exclude(status="resolved").exists()
    assert not undispatched_alerts(timezone.now() + timedelta(minutes=5))


OWN_SCRIPT = Path(__file__).parent / "scripts" / "own_train.py"


def test_the_teams_own_training_command_passes_a_drill_without_the_consoles_secrets(
    live_console, drill_team, settings
):
    """A team's own script (not the built-in workload) as the drill workload: every line
    passes, and its environment held the sandbox's settings but none of the console's."""
    settings.DRILL_TEAM_COMMANDS = True
    admin = drill_team.memberships.get(role="admin").user
    python = shlex.quote(sys.executable)
    workloads.save_team_workload(
        admin,
        drill_team.pk,
        {
            "command": f"{python} {shlex.quote(str(OWN_SCRIPT))}",
            "verify_command": f"{python} {shlex.quote(str(OWN_SCRIPT))} --verify -",
        },
    )
    output, code = drill(live_console, "--scenario", "nan_loss", "--workload", "team")
    run = DrillRun.objects.get(team=drill_team)
    assert code == 0 and run.status == DrillStatus.PASSED, output
    assert run.command.endswith("own_train.py") and f"workload: {run.command}" in output
    folder = Path(settings.DRILL_DIR) / str(run.drill_set) / f"{run.pk}-nan_loss"
    assert (folder / "gpus-freed").exists()  # the script's own release hook ran
    names = set(json.loads((folder / "environment.json").read_text()))
    assert {"BRAKELINE_URL", "BRAKELINE_TOKEN", "BRAKELINE_DRILL_SANDBOX", "PATH"} <= names
    leaked = names & {"DATABASE_URL", "REDIS_URL", "BRAKELINE_SECRET_KEY", "DJANGO_SETTINGS_MODULE"}
    assert not leaked, leaked
    loads = run.checks.get(name="checkpoint loads").measured
    assert loads.startswith("restored step ") and "one step ran" in loads
