"""The same DCGM names pushed through the agent protocol: read with DCGM's semantics by the
default rule pack (the XID gauge changes, counters rise), braked like any breaker's alert."""

from __future__ import annotations

import pytest

from breakers.detection.evaluation import evaluate_job
from breakers.detection.rules import install_default_pack
from breakers.models import Command
from incidents.models import Alert

pytestmark = pytest.mark.django_db


def push(agent_post, points):
    body = {
        "points": [{"name": n, "step": s, "value": v, "node": node} for n, s, v, node in points]
    }
    response = agent_post("/api/v1/agent/metrics", body)
    assert response.status_code == 202, response.content


def test_a_fatal_xid_pushed_by_the_agent_terminates_and_isolates_its_node(agent, agent_post):
    install_default_pack()
    xid = "DCGM_FI_DEV_XID_ERRORS"
    # The gauge reads 0, then 79 on node B (and stays 79: one error, not one per point).
    push(agent_post, [(xid, s, 0, node) for s in range(5) for node in ("gpu-a", "gpu-b")])
    push(
        agent_post,
        [
            (xid, s, 79 if node == "gpu-b" else 0, node)
            for s in range(5, 10)
            for node in ("gpu-a", "gpu-b")
        ],
    )
    evaluate_job(agent.job_id)
    (alert,) = Alert.objects.filter(job_id=agent.job_id)
    assert (alert.rule_key, alert.severity, alert.node) == ("dcgm-xid-fatal", "L4", "gpu-b")
    assert "XID 79" in alert.description and "fallen off the bus" in alert.description
    commands = {(c.kind, c.params.get("node")) for c in Command.objects.filter(job_id=agent.job_id)}
    assert commands == {("terminate", None), ("isolate_node", "gpu-b")}


def test_a_warning_xid_and_rising_ecc_counters(agent, agent_post):
    install_default_pack()
    push(agent_post, [("DCGM_FI_DEV_XID_ERRORS.gpu3", 1, 13, "gpu-a")])
    push(
        agent_post,
        [("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", s, v, "gpu-c") for s, v in enumerate([4, 4, 4, 5])],
    )
    evaluate_job(agent.job_id)
    alerts = {a.rule_key: a for a in Alert.objects.filter(job_id=agent.job_id)}
    assert alerts["dcgm-xid"].severity == "L2" and alerts["dcgm-xid"].node == "gpu-a"
    assert alerts["dcgm-ecc-dbe"].severity == "L4" and alerts["dcgm-ecc-dbe"].node == "gpu-c"
    assert "rose from 4 to 5" in alerts["dcgm-ecc-dbe"].description
    isolated = Command.objects.filter(job_id=agent.job_id, kind="isolate_node")
    assert [c.params["node"] for c in isolated] == ["gpu-c"]


def test_a_counter_reset_is_no_error(agent, agent_post):
    install_default_pack()
    push(
        agent_post,
        [("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", s, v, "gpu-a") for s, v in enumerate([7, 7, 0, 0])],
    )
    evaluate_job(agent.job_id)
    assert not Alert.objects.filter(job_id=agent.job_id).exists()
    assert not Command.objects.filter(job_id=agent.job_id).exists()
