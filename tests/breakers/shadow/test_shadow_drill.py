"""A drill exercises the team's shadow rules: the NaN drill on a real PyTorch sandbox passes as
always (the live rule brakes it), and its scorecard lists what the shadow rule watching the same
loss would have done."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from breakers.detection import rulesets
from breakers.drills.console_check import console_health
from breakers.models import DrillRun, DrillStatus
from tests.support.waiting import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("watchdog_beat"),
]


def test_the_scorecard_lists_what_the_shadow_rule_would_have_done(live_console, drill_team):
    admin = drill_team.memberships.get(role="admin").user
    rulesets.change_rules(
        admin,
        drill_team.pk,
        "would stopping the whole job have been right?",
        [
            {
                "op": "create",
                "key": "loss-nan-observed",
                "fields": {
                    "name": "NaN loss, observed",
                    "layer": "stability",
                    "metric": "loss",
                    "detector": "non_finite",
                    "severity": "L4",
                    "action": "terminate_and_isolate",
                    "shadow": True,
                },
            }
        ],
    )
    # A console started for this test answers "starting" until it hears the watchdog beat.
    wait_for(lambda: console_health(live_console)[0] is None, "the console to be ready", 120)
    out = io.StringIO()
    try:
        call_command(
            "drill",
            "--team",
            "research",
            "--console-url",
            live_console,
            "--scenario",
            "nan_loss",
            stdout=out,
        )
    except CommandError as error:
        pytest.fail(f"the drill did not pass: {error}\n{out.getvalue()}")
    output = out.getvalue()
    run = DrillRun.objects.get(team=drill_team)
    assert run.status == DrillStatus.PASSED, output
    line = run.checks.get(name="shadow rules")
    assert line.passed and line.measured == "1 would have fired", line.detail
    assert line.detail.startswith("loss-nan-observed: L4 terminate_and_isolate at step ")
    assert "after the fault" in line.detail
