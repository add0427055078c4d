"""Straggler scores (pure, table-driven) and the check that records a performance finding per
slow rank with its node, resolved once the rank is back within pace."""

from __future__ import annotations

import pytest

from breakers.pace.stragglers import MIN_USUAL_SAMPLES, RankPace, next_usual, scores


def pace(rank: int, step_time: float, usual: float | None = None, flagged: bool = False):
    return RankPace(rank, f"gpu-{rank}", step_time, usual, MIN_USUAL_SAMPLES, flagged)


@pytest.mark.parametrize(
    ("ranks", "stragglers"),
    [
        ([pace(0, 1.0), pace(1, 1.05), pace(2, 1.19)], []),  # within 20 % of the fastest
        ([pace(0, 1.0), pace(1, 1.05), pace(2, 1.2)], [2]),  # 20 % slower: flagged
        ([pace(0, 1.3), pace(1, 1.0)], [0]),  # rank 0 can straggle too
        ([pace(0, 1.0)], []),  # alone, no history: nothing to compare with
        ([pace(0, 1.25, usual=1.0)], [0]),  # alone, but slower than its own usual pace
        ([pace(0, 1.5, usual=1.4), pace(1, 1.5, usual=1.0)], [1]),  # all slow; rank 1 changed
        ([pace(0, 1.0), pace(1, 1.15, flagged=True)], [1]),  # hysteresis: stays until ≤ 10 %
        ([pace(0, 1.0), pace(1, 1.09, flagged=True)], []),  # back within 10 %: cleared
        ([pace(0, 1.0), pace(1, float("nan")), pace(2, 0.0)], []),  # unusable times: skipped
    ],
)
def test_a_rank_20_percent_slower_than_the_fastest_or_its_usual_pace_is_a_straggler(
    ranks, stragglers
):
    assert [s.rank for s in scores(ranks) if s.straggler] == stragglers


def test_the_score_says_how_much_slower_and_where():
    slow = [s for s in scores([pace(0, 1.0, usual=1.0), pace(3, 1.5, usual=1.2)]) if s.straggler]
    assert slow[0].vs_fastest == pytest.approx(1.5) and slow[0].vs_usual == pytest.approx(1.25)
    assert slow[0].describe() == (
        "rank 3 on gpu-3: 1.5 s per step, 50 % slower than the fastest rank (0), "
        "25 % slower than its own usual pace"
    )


def test_a_stragglers_slow_steps_are_not_learnt_as_its_usual_pace():
    assert next_usual(pace(1, 2.0, usual=1.0), straggler=True) == (1.0, MIN_USUAL_SAMPLES)
    usual, samples = next_usual(pace(1, 2.0, usual=1.0), straggler=False)
    assert 1.0 < usual < 1.1 and samples == MIN_USUAL_SAMPLES + 1
    assert next_usual(RankPace(0, "", 0.8), straggler=False) == (0.8, 1)


@pytest.mark.django_db
def test_the_check_records_one_finding_per_slow_rank_with_its_node_then_resolves_it(make_agent):
    from django.utils import timezone

    from breakers.pace.checks import check_running_jobs
    from incidents.models import Alert, AlertStatus, Incident, Job, JobRank

    job = make_agent()
    Job.objects.filter(pk=job.job_id).update(status="running", world_size=3)
    now = timezone.now()
    for rank, seconds in ((0, 1.0), (1, 1.02), (2, 1.4)):
        JobRank.objects.create(
            job_id=job.job_id,
            rank=rank,
            hostname=f"gpu-{rank}",
            step=100,
            step_time_seconds=seconds,
            last_heartbeat_at=now,
            status="running",
        )
    for _ in range(2):  # twice: the same state changes nothing
        found = check_running_jobs()[job.job_id]
    assert [s.rank for s in found if s.straggler] == [2]
    alert = Alert.objects.get(job_id=job.job_id)
    assert (alert.layer, alert.severity, alert.node, alert.nodes) == (
        "performance",
        "L1",
        "gpu-2",
        ["gpu-2"],
    )
    assert "rank 2 on gpu-2" in alert.description and "40 % slower" in alert.description
    assert not Incident.objects.exists()  # a finding for the digest, never an incident
    JobRank.objects.filter(job_id=job.job_id, rank=2).update(step_time_seconds=1.05)
    check_running_jobs()
    alert.refresh_from_db()
    assert alert.status == AlertStatus.RESOLVED


@pytest.mark.django_db
def test_under_lockstep_the_rank_doing_more_work_is_flagged_by_its_compute_time(make_agent):
    """Synchronous data parallelism: every rank's step interval is the slowest one's, so only
    each rank's own compute time (the wait in the all-reduce left out) tells the slow one."""
    from django.utils import timezone

    from breakers.control.watchdog import watchdog_tick
    from breakers.pace.checks import check_running_jobs
    from incidents.models import Alert, AlertStatus, Job, JobRank

    job = make_agent()
    Job.objects.filter(pk=job.job_id).update(status="running", world_size=4)
    now = timezone.now()
    for rank in range(4):  # lock-step: 1 ms a step on every rank; rank 2 works 90 % more
        JobRank.objects.create(
            job_id=job.job_id,
            rank=rank,
            hostname=f"gpu-{rank}",
            step=100,
            step_time_seconds=0.001,
            last_heartbeat_at=now,
            status="running",
            compute_seconds=0.00095 if rank == 2 else 0.0005,
        )
    found = check_running_jobs()[job.job_id]
    assert [s.rank for s in found if s.straggler] == [2]
    alert = Alert.objects.get(job_id=job.job_id)
    assert alert.metric == "compute_time" and alert.nodes == ["gpu-2"]
    assert "0.00095 s of its own compute per step, 90 % slower" in alert.description
    # The job ends: its finding settles, whatever ended it.
    Job.objects.filter(pk=job.job_id).update(status="finished")
    watchdog_tick(lambda command_id: None)
    alert.refresh_from_db()
    assert alert.status == AlertStatus.RESOLVED


@pytest.mark.django_db
@pytest.mark.parametrize("world", [8, 256])
def test_the_check_of_a_job_costs_the_same_statements_at_any_size(make_agent, world):
    """Every rank's pace remembered in one upsert: a job of 10,000 ranks is not 30,000
    statements holding its history's rows (and, past a finding, its job's row)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from breakers.models import RankPaceHistory
    from breakers.pace.checks import check_job
    from incidents.models import Job, JobRank

    job_id = make_agent().job_id
    Job.objects.filter(pk=job_id).update(status="running", world_size=world)
    now = timezone.now()
    JobRank.objects.bulk_create(
        JobRank(
            job_id=job_id,
            rank=r,
            step=9,
            step_time_seconds=1.0 + r % 2 / 100,
            last_heartbeat_at=now,
            status="running",
        )
        for r in range(world)
    )
    counts = []
    for _ in range(2):  # the first check seats the history, the second updates it
        with CaptureQueriesContext(connection) as queries:
            check_job(job_id, now)
        counts.append(len(queries))
    assert counts == [STATEMENTS_PER_CHECK] * 2, [q["sql"][:60] for q in queries]
    assert RankPaceHistory.objects.filter(job_id=job_id, samples=2).count() == world


# The running ranks read, their history read, one upsert.
STATEMENTS_PER_CHECK = 3
