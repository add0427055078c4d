"""The goodput ledger of a scripted job, correct to the second: the job runs from T0 − 1 h, a
NaN at T0 + 10 s is braked (L3 at 13 s, checkpoint saved at 21 s) and training resumes at
103 s — once plainly, once rolled back to a checkpoint written at T0 − 50 s. Every moment is
on a travelled clock (time_machine), never the wall clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.test import Client

from breakers.checkpoints import parse_report, record_checkpoint
from breakers.ledger import goodput_ledger
from incidents.models import NotificationPolicy
from tests.support.review import GPUS_PER_NODE, NODES, T0, Team, run_flow

pytestmark = pytest.mark.django_db

ACCELERATORS = NODES * GPUS_PER_NODE
HOUR = timedelta(hours=1)
AUTOMATIC = {
    "lost_progress": 0.0,
    "detection": 3.0,
    "decision": 0.0,
    "saving": 8.0,
    "recovery": 82.0,
}


@pytest.fixture
def team(db) -> Team:
    from incidents.jobs import create_job

    with time_machine.travel(T0 - HOUR, tick=False):
        created = create_job("research", "ledger-run")
    NotificationPolicy.objects.filter(team=created.job.team).delete()
    return Team(team=created.job.team, job_id=created.job.pk)


def test_a_braked_and_resumed_job_to_the_second(team):
    flow = run_flow(team)
    document = goodput_ledger(team.person("viewer"), team.team.pk, T0 - HOUR, T0 + HOUR)
    (job,) = document["jobs"]
    assert (job["wall_seconds"], job["lost"], job["lost_seconds"]) == (7200.0, AUTOMATIC, 93.0)
    assert job["productive_seconds"] == 7107.0 and job["ettr"] == 7107.0 / 7200.0
    assert job["accelerators"] == ACCELERATORS and job["accelerator_hours"] == 64.0
    assert job["lost_accelerator_hours"] == ACCELERATORS * 93.0 / 3600.0
    (incident,) = document["incidents"]
    assert incident["id"] == flow.incident_id and incident["lost"] == AUTOMATIC
    assert (incident["alarm_after_seconds"], incident["alarm_after_steps"]) == (3.0, 0)
    assert (incident["brake_after_seconds"], incident["brake_after_steps"]) == (11.0, 2)
    assert document["total"] == {key: job[key] for key in document["total"]}
    (week,) = document["weeks"]
    assert week["week"] == "2026-03-02T00:00:00Z" and week["lost_seconds"] == 93.0


def test_a_roll_back_loses_the_progress_since_its_checkpoint(team):
    checkpoint = {"path": "/ckpt/step-40.pt", "step": 40, "sha256": "cd" * 32}
    with time_machine.travel(T0 - timedelta(seconds=50), tick=False):
        record_checkpoint(team.job_id, parse_report({**checkpoint, "reason": "framework"}))
    run_flow(team, roll_back=checkpoint)
    document = goodput_ledger(team.person("viewer"), team.team.pk, T0 - HOUR, T0 + HOUR)
    (incident,) = document["incidents"]
    assert incident["lost"] == {**AUTOMATIC, "lost_progress": 60.0}
    assert document["total"]["lost_seconds"] == 153.0
    assert document["total"]["productive_seconds"] == 7200.0 - 153.0


def test_the_team_report_shows_the_ledger_and_its_exports(team):
    run_flow(team)
    browser = Client()
    browser.force_login(team.person("viewer"))
    page = browser.get(f"/teams/{team.team.pk}/report/?since=2026-03-02&until=2026-03-03")
    text = page.content.decode()
    assert page.status_code == 200
    # 16 h run (08:00 → midnight), 93 s lost: 57,507 / 57,600.
    assert '<b id="ledger-ettr">99.8 %</b>' in text
    assert 'id="ledger-hours">512.00</span>' in text  # 32 accelerators × 16 h
    assert 'data-label="alarm after">3 s · 0 steps<' in text
    assert 'data-label="brake after">11 s · 2 steps<' in text
    assert f"/api/v1/teams/{team.team.pk}/ledger.csv?since=" in text
