"""Re-run to attribute on the real stack: a real training process whose step guard refuses a
non-finite step re-runs it on the same batch from the unchanged pre-step state, and the
console's verdict follows what came of it.

The training subprocess is tests/brakeline/scripts/train_rollback.py stepping its optimizer
with a closure (--closure) and the SDK's re-run on (--rerun): --poison-at S makes step S's
inputs NaN (every evaluation meets them: data), --flip-at S writes a NaN into one gradient of
step S once, on its way (the re-run computes it right: a transient fault of the node). The
team's NaN rules recover automatically (docs/recovery.md).
"""

from __future__ import annotations

from breakers.control.job_actions import terminate_job
from breakers.models import Command, CommandKind
from incidents.models import (
    Job,
    JobRank,
    JobStatus,
    Recovery,
    RecoveryStatus,
    RecoveryVerdict,
    TimelineEntry,
)
from tests.brakeline.live import (
    LIVE_STACK_MARKS,
    recover_automatically,
    same_losses_after,
    wait_for,
)
from tests.support.authz import make_member

pytestmark = LIVE_STACK_MARKS

STEPS = 50
AT = 30


def _start(training, name: str, *args, **console):
    return training.start(
        "train_rollback.py",
        name,
        "--steps",
        STEPS,
        "--closure",
        *args,
        "--checkpoint-every",
        7,
        "--step-seconds",
        0.02,
        **console,
    )


def _verdict(job_id: int, training) -> Recovery:
    wait_for(
        lambda: Recovery.objects.filter(job_id=job_id).exists(),
        "the recovery verdict",
        timeout=120,
        training=training,
    )
    return Recovery.objects.get(job_id=job_id)


def _flags(recovery: Recovery) -> list[TimelineEntry]:
    rows = TimelineEntry.objects.filter(incident_id=recovery.incident_id).order_by("pk")
    return [row for row in rows if row.data.get("event") == "rerun_attribution"]


def test_a_batch_that_gives_nan_again_is_the_datas_recovered_past(live_console, agent, training):
    recover_automatically(agent.job_id)
    reference = _start(training, "reference", "--skip-step", AT)
    console = {"url": live_console, "token": agent.token}
    braked = _start(training, "data", "--rerun", "--poison-at", AT, **console)
    recovery = _verdict(agent.job_id, braked)
    assert recovery.verdict == RecoveryVerdict.RECOVER, recovery.reasons
    assert recovery.evidence["rerun"]["attribution"] == "data"
    assert recovery.evidence["rerun"]["step"] == AT
    assert any("the data (or the model), not the node" in r for r in recovery.reasons)
    (flag,) = _flags(recovery)
    assert flag.message.startswith(f"Batch of step {AT} flagged")
    wait_for(
        lambda: Recovery.objects.get(pk=recovery.pk).status == RecoveryStatus.RECOVERED,
        "the roll back and resume",
        timeout=120,
        training=braked,
    )
    # The re-run left no trace: after the flagged batch, the run trains exactly as one that
    # never met it, bit for bit.
    same_losses_after(reference, braked, AT, STEPS)


def test_a_one_off_nan_in_a_gradient_isolates_and_pages_the_node(live_console, agent, training):
    recover_automatically(agent.job_id)
    console = {"url": live_console, "token": agent.token}
    braked = _start(training, "transient", "--rerun", "--flip-at", AT, **console)
    recovery = _verdict(agent.job_id, braked)
    node = JobRank.objects.get(job_id=agent.job_id, rank=0).hostname
    assert node and recovery.node == node
    assert recovery.verdict == RecoveryVerdict.ISOLATE_AND_PAGE, recovery.reasons
    assert recovery.status == RecoveryStatus.HELD
    assert recovery.evidence["rerun"] == {
        "step": AT,
        "attribution": "transient",
        "rank": None,
        "node": node,
    }
    assert any(f"transient fault of the node {node}, not the data" in r for r in recovery.reasons)
    (flag,) = _flags(recovery)
    assert flag.message.startswith(f"Node {node} flagged: step {AT}")
    # Nothing automatic: the job stays paused for a person, who decides about the node.
    wait_for(
        lambda: Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED,
        "the job to stay paused",
    )
    assert not Command.objects.filter(job_id=agent.job_id, kind=CommandKind.RESUME).exists()
    manager = make_member(Job.objects.get(pk=agent.job_id).team, "manager")
    terminate_job(manager, agent.job_id, reason="gpu suspect: drain the node, then relaunch")
    assert braked.wait(timeout=60) == 75, braked.tail()
