"""The whole job stops, and stays stopped, under real torchrun (gloo on CPU) against the real
console: a hung rank is named and the executor stops every rank and the torchrun agent (2
ranks); an L4 terminate ends every rank once — the rank that gets it stops its torchrun agent —
and torchrun --max-restarts=2 restarts nothing (2 ranks; 4 pass as well, at twice the time)."""

from __future__ import annotations

import pytest

from breakers.control.commands import issue_command, stop_hung_job
from breakers.control.heartbeats import check_heartbeats
from breakers.models import Command, CommandKind, JobLauncher
from core.processes import process_start_time
from incidents.models import Alert, Job, JobRank, JobStatus
from tests.brakeline.live import wait_for
from tests.brakeline.torchrun import torchrun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _gone(pid: int) -> bool:
    return process_start_time(pid) is None


def _registered(job_id: int, ranks: int, step: int) -> JobLauncher:
    def ready() -> JobLauncher | None:
        at = JobRank.objects.filter(job_id=job_id, step__gte=step).count()
        launcher = JobLauncher.objects.filter(job_id=job_id, start_time__isnull=False).first()
        return launcher if at == ranks and launcher and len(launcher.ranks) == ranks else None

    return wait_for(ready, f"{ranks} ranks past step {step} under a verified launcher", 120)


def test_a_hung_rank_is_named_and_the_whole_job_is_stopped(live_console, agent, tmp_path):
    Job.objects.filter(pk=agent.job_id).update(heartbeat_timeout_seconds=3)
    run = torchrun(
        tmp_path,
        "--steps",
        "100000",
        "--hang-rank",
        "1",
        "--hang-at",
        "12",
        # Rank 0 goes silent too, once it blocks in the next step's all_reduce: a step of
        # 0.5 s (5 heartbeat intervals) keeps the hung rank the first silent one on a loaded
        # machine; with 20 ms steps the two fell silent within one interval, in either order.
        "--step-seconds",
        "0.5",
        console=live_console,
        token=agent.token,
    )
    try:
        launcher = _registered(agent.job_id, 2, 5)
        assert launcher.pid == run.process.pid and launcher.pgid == run.process.pid
        ranks = wait_for(
            lambda: (
                (r := list(JobRank.objects.filter(job_id=agent.job_id).order_by("rank")))
                and r[1].step == 11
                and r[0].step == 12
                and r
            ),
            "rank 1 stuck at 11 while rank 0 passed step 12",
            60,
        )
        wait_for(lambda: check_heartbeats(), "the heartbeat alert", 60)
        alert = Alert.objects.get(job_id=agent.job_id)
        # Named first either way: alone if it fell silent first; as the rank rank 0 waits
        # for if rank 0 did (its last word, entering step 12's sync, can be the later one).
        silent = f"rank 1 of 2 is silent ({ranks[1].hostname}, pid {ranks[1].pid})"
        named = (silent, "rank 1 of 2 is hung (")
        assert alert.description.startswith(named), alert.description
        command = Command.objects.get(job_id=agent.job_id, kind=CommandKind.CHECKPOINT_AND_PAUSE)
        outcome = stop_hung_job(command.pk, grace_seconds=10)  # as on the ack's expiry
        assert outcome.stopped, outcome
        assert any("process group of launcher" in step for step in outcome.steps), outcome.steps
        run.wait(60)
        assert all(_gone(pid) for pid in (run.process.pid, ranks[0].pid, ranks[1].pid))
        assert Job.objects.get(pk=agent.job_id).status == JobStatus.TERMINATED
        assert [s[0] for s in run.starts()] in (["0", "1"], ["1", "0"])  # no restart
    finally:
        run.kill()


def test_l4_terminate_ends_every_rank_once_and_torchrun_does_not_restart_it(
    live_console, agent, tmp_path
):
    run = torchrun(
        tmp_path,
        "--steps",
        "100000",
        "--step-seconds",
        "0.02",
        max_restarts=2,
        ranks=2,
        console=live_console,
        token=agent.token,
    )
    try:
        _registered(agent.job_id, 2, 5)
        pids = list(JobRank.objects.filter(job_id=agent.job_id).values_list("pid", flat=True))
        issue_command(agent.job_id, "terminate", reason="L4 test", severity="L4")
        code = run.wait(120)
    finally:
        run.kill()
    # The terminated rank stopped its agent: torchrun reports the SIGTERM it got (exit 1) and
    # never started the worker group again. Its warning is sometimes lost to a logging error
    # (torch logs from its signal handler), its SignalException never is.
    log = run.log.read_text(errors="replace")
    got = "Received 15 death signal" in log or "got signal: 15" in log
    assert code == 1 and got, run.tail()
    trained = run.starts()
    assert sorted(s[0] for s in trained) == ["0", "1"], trained  # each rank once
    assert all(s[1] == "0" for s in trained), trained  # only in the first incarnation
    assert (tmp_path / "checkpoints" / ".brakeline-terminated.json").exists()
    assert all(_gone(pid) for pid in pids)
    command = Command.objects.get(job_id=agent.job_id, kind=CommandKind.TERMINATE)
    assert command.status == "succeeded" and command.result["exit_code"] == 0
