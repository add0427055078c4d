"""Four ranks under real torchrun (gloo on CPU, DDP) against the real console: the rank
doing 90 % more work than the others is the one straggler, although lock-step makes every
rank's step interval the same; then it hangs inside its step's work, the three others block
in that step's all-reduce, and the alert names it and them, and the job is stopped as soon as
every rank is silent, not at the brake's acknowledgement deadline."""

from __future__ import annotations

from datetime import timedelta

import pytest

from breakers.control.commands import stop_hung_job
from breakers.control.watchdog import watchdog_tick
from breakers.models import Command, CommandKind
from breakers.pace.checks import check_running_jobs
from core.processes import process_start_time
from incidents.models import Alert, Job, JobRank, JobStatus, TimelineEntry
from tests.brakeline.live import wait_for
from tests.brakeline.torchrun import torchrun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HANG_AT = 70


def _timed_ranks(job_id: int, step: int) -> list[JobRank] | None:
    ranks = list(JobRank.objects.filter(job_id=job_id, step__gte=step).order_by("rank"))
    return ranks if len(ranks) == 4 and all(r.compute_seconds for r in ranks) else None


def test_the_slow_rank_is_flagged_then_named_when_it_hangs_and_the_job_stops_at_once(
    live_console, agent, tmp_path
):
    Job.objects.filter(pk=agent.job_id).update(heartbeat_timeout_seconds=3)
    run = torchrun(
        tmp_path,
        "--steps",
        "100000",
        "--work-seconds",
        "0.05",
        "--more-work-rank",
        "2",
        "--more-work-seconds",
        "0.045",  # 90 % more of its own work
        "--hang-rank",
        "2",
        "--hang-at",
        str(HANG_AT),
        "--hang-in-work",
        ranks=4,
        console=live_console,
        token=agent.token,
    )
    try:
        ranks = wait_for(lambda: _timed_ranks(agent.job_id, 30), "4 ranks timed past 30", 120)
        compute = {r.rank: r.compute_seconds for r in ranks}
        assert compute[2] > 1.5 * max(compute[r] for r in (0, 1, 3)), compute
        found = check_running_jobs()[agent.job_id]
        assert [s.rank for s in found if s.straggler] == [2], found
        straggler = Alert.objects.get(job_id=agent.job_id, rule_key="rank-straggler")
        assert straggler.metric == "compute_time"
        assert "rank 2 on" in straggler.description

        stopped = []

        def stop_when_all_silent():
            watchdog_tick(lambda command_id: stopped.append(stop_hung_job(command_id)))
            return stopped

        (outcome,) = wait_for(stop_when_all_silent, "the job stopped once every rank is silent", 90)
        assert outcome.stopped, outcome
        alert = Alert.objects.get(job_id=agent.job_id, rule_key="heartbeat-timeout")
        pids = {r.rank: r.pid for r in JobRank.objects.filter(job_id=agent.job_id)}
        assert alert.description.startswith(
            f"rank 2 of 4 is hung ({ranks[2].hostname}, pid {pids[2]}): at step {HANG_AT - 1} "
            f"it never entered step {HANG_AT}'s gradient sync; ranks 0, 1, 3 wait on it in "
            "that collective"
        ), alert.description
        pause = Command.objects.get(job_id=agent.job_id, kind=CommandKind.CHECKPOINT_AND_PAUSE)
        assert pause.status == "expired"
        assert pause.deliver_by < pause.issued_at + timedelta(seconds=60)  # not the 300 s
        note = TimelineEntry.objects.get(data__event="all_ranks_silent")
        assert "Every rank of the job (4 of 4) is silent" in note.message
        run.wait(60)
        assert all(process_start_time(pid) is None for pid in pids.values())
        assert Job.objects.get(pk=agent.job_id).status == JobStatus.TERMINATED
        watchdog_tick(lambda command_id: None)  # the ended job's alerts settle
        assert not Alert.objects.filter(job_id=agent.job_id, status="firing").exists()
    finally:
        run.kill()
