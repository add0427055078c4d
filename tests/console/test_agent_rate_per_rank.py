"""The agent rate limit grows with the job's ranks: one big job is not refused by a per-job
limit sized for one process, and a runaway single process still is."""

from __future__ import annotations

import pytest

from console.ratelimit import MAX_RATED_RANKS, agent_rate, rate_counter

# Each test runs through the lean route and through the DRF views (tests/support/agent_doors.py).
BOTH_AGENT_DOORS = True

pytestmark = pytest.mark.django_db
METRICS = "/api/v1/agent/metrics"


def rates(settings, job_rate: str, per_rank: str) -> None:
    throttle = dict(settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], agent=job_rate)
    settings.REST_FRAMEWORK = dict(settings.REST_FRAMEWORK, DEFAULT_THROTTLE_RATES=throttle)
    settings.AGENT_RATE_PER_RANK = per_rank


@pytest.mark.parametrize(
    ("job_rate", "per_rank", "world_size", "expected"),
    [
        ("6000/min", "150/min", None, (6000, 60)),  # one process: the job's rate
        ("6000/min", "150/min", 1, (6000, 60)),
        ("6000/min", "150/min", 40, (6000, 60)),  # 40 × 150 = 6,000: the same
        ("6000/min", "150/min", 100, (15_000, 60)),  # above: per rank
        ("6000/min", "150/min", 10_000, (1_500_000, 60)),  # a 10,000-rank job
        ("6000/min", "5/s", 10, (6000, 60)),  # 3,000/min: the job's rate wins
        ("6000/min", "5/s", 1000, (300_000, 60)),
        ("100/s", "1/min", 7, (100, 1)),  # 7/min is 0.12/s: the job's rate wins
        ("100/s", "120/min", 7, (100, 1)),  # 14/s
        ("100/s", "120/min", 70, (140, 1)),
        ("3/hour", "2/hour", 4, (8, 3600)),
        ("6000/min", "150/min", 10**9, (150 * MAX_RATED_RANKS, 60)),  # a claim, capped
        ("6000/min", "150/min", 0, (6000, 60)),
        ("3/hour", "150/min", 1, (3, 3600)),  # one process: never per rank
    ],
)
def test_the_limit_is_the_jobs_or_per_rank_times_ranks(
    settings, job_rate, per_rank, world_size, expected
):
    rates(settings, job_rate, per_rank)
    assert agent_rate(world_size) == expected


def test_a_job_of_many_ranks_is_not_refused_where_one_process_would_be(agent, agent_post, settings):
    rates(settings, "3/hour", "2/hour")
    rate_counter().reset(f"agent:{agent.job_id}")
    # Four ranks heartbeat (world size 4): the job may send 4 × 2 = 8 requests this hour.
    beats = [
        agent_post(
            "/api/v1/agent/heartbeat",
            {"step": 1, "status": "running", "rank": rank, "world_size": 4},
        ).status_code
        for rank in range(4)
    ]
    points = {"points": [{"name": "loss", "step": 2, "value": 1.0}]}
    codes = [agent_post(METRICS, points).status_code for _ in range(5)]
    assert beats == [200, 200, 200, 200]
    assert codes == [202, 202, 202, 202, 429]
