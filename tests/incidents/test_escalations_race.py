"""Two managers deciding the same request at the same moment, on real PostgreSQL connections:
exactly one decision wins, the other is 409, and exactly one command reaches the job."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test import Client

from breakers.models import Command
from incidents.models import AuditEntry, EscalationRequest, TimelineEntry
from tests.support.authz import Api, raise_alert

RACERS = 2


def decide_at_once(requests: list[tuple[Api, str]]) -> list[int]:
    """POST each (api, path) from its own thread, released together; the status codes."""
    barrier = threading.Barrier(len(requests))
    codes: list[int] = [0] * len(requests)
    errors: list[BaseException] = []

    def run(index: int, api: Api, path: str) -> None:
        try:
            client = Client()  # one per thread: its own request, its own DB connection
            barrier.wait(timeout=10)
            codes[index] = client.post(
                path, "{}", content_type="application/json", headers=api.headers
            ).status_code
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=run, args=(index, api, path))
        for index, (api, path) in enumerate(requests)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    return codes


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("second_verb", ["approve", "reject"])
def test_two_managers_deciding_at_once_one_wins_the_other_gets_409(scene, second_verb):
    assert connection.vendor == "postgresql"
    alert = raise_alert(scene.job_id, "L2")
    oncall = scene.api("oncall")
    created = oncall.post(
        "/api/v1/escalations",
        {
            "job_id": scene.job_id,
            "alert_id": alert.pk,
            "command": {"kind": "checkpoint_and_pause"},
            "reason": "diverging",
        },
    )
    request_id = created.json()["id"]
    first, second = scene.api("manager"), scene.api("admin")

    codes = decide_at_once(
        [
            (first, f"/api/v1/escalations/{request_id}/approve"),
            (second, f"/api/v1/escalations/{request_id}/{second_verb}"),
        ]
    )

    assert sorted(codes) == [200, 409]
    request = EscalationRequest.objects.get(pk=request_id)
    winner = first if codes[0] == 200 else second
    assert request.decided_by == winner.user
    commands = Command.objects.filter(job_id=scene.job_id)
    assert commands.count() == (1 if request.status == "approved" else 0)
    decisions = TimelineEntry.objects.filter(
        kind__in=["escalation_approved", "escalation_rejected"]
    )
    assert decisions.count() == 1
    outcomes = sorted(
        AuditEntry.objects.filter(target_type="escalation").values_list("outcome_code", flat=True)
    )
    assert outcomes == ["conflict", "ok"]


@pytest.mark.django_db(transaction=True)
def test_racing_approvals_never_send_the_command_twice(scene):
    """The same race with every decider approving: one command, whatever the interleaving."""
    alert = raise_alert(scene.job_id, "L2")
    created = scene.api("oncall").post(
        "/api/v1/escalations",
        {
            "job_id": scene.job_id,
            "alert_id": alert.pk,
            "command": {"kind": "lower_lr", "params": {"factor": 0.2}},
            "reason": "diverging",
        },
    )
    path = f"/api/v1/escalations/{created.json()['id']}/approve"
    deciders = [scene.api("manager"), scene.api("admin"), Api(scene.extra("m2", "manager"))]
    codes = decide_at_once([(api, path) for api in deciders])
    assert sorted(codes) == [200, 409, 409]
    assert Command.objects.filter(job_id=scene.job_id).count() == 1
