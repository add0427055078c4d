"""Fixed-window rate counters: Redis in the server mode, process memory when embedded."""

from __future__ import annotations

import logging
import threading
import time
from functools import cache
from typing import TYPE_CHECKING

from django.conf import settings

from core.redis_clients import redis_client

if TYPE_CHECKING:
    from incidents.models import Job

log = logging.getLogger(__name__)

PERIODS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600, "d": 86400, "day": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """'6000/min' → (6000, 60)."""
    count, _, period = rate.partition("/")
    return int(count), PERIODS[period]


class RedisRateCounter:
    def __init__(self, prefix: str):
        self.client = redis_client()
        self.prefix = prefix

    def hit(self, key: str, limit: int, period: int) -> float:
        """Count one request; 0 if allowed, else seconds until the window ends."""
        now = time.time()
        window = int(now // period)
        redis_key = f"{self.prefix}:rate:{key}:{window}"
        pipeline = self.client.pipeline(transaction=False)
        pipeline.incr(redis_key)
        pipeline.expire(redis_key, period + 1)
        count = pipeline.execute()[0]
        return 0.0 if count <= limit else (window + 1) * period - now

    def reset(self, key: str) -> None:
        for redis_key in self.client.scan_iter(f"{self.prefix}:rate:{key}:*"):
            self.client.delete(redis_key)


class MemoryRateCounter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[tuple[str, int], int] = {}

    def hit(self, key: str, limit: int, period: int) -> float:
        now = time.time()
        window = int(now // period)
        with self.lock:
            count = self.counts[(key, window)] = self.counts.get((key, window), 0) + 1
            if len(self.counts) > 10_000:  # forget finished windows
                self.counts = {k: v for k, v in self.counts.items() if k[1] >= window}
        return 0.0 if count <= limit else (window + 1) * period - now

    def reset(self, key: str) -> None:
        with self.lock:
            self.counts = {k: v for k, v in self.counts.items() if k[0] != key}


# A job's world size raises its limit at most this far: the claim is the agent's own (its
# heartbeats), so it cannot lift the limit without bound (2²⁰ ranks is beyond any job today).
MAX_RATED_RANKS = 1 << 20


def agent_rate(world_size: int | None) -> tuple[int, int]:
    """A job's agent request limit (count, period in seconds): ``BRAKELINE_AGENT_RATE``, or for
    a job of several ranks ``BRAKELINE_AGENT_RATE_PER_RANK`` times the ranks it runs (its
    heartbeats' ``world_size``) when that is more. One job of 10,000 ranks at the SDK's
    defaults (about 1.2 requests a second per rank) is never refused; a runaway single
    process still is."""
    from rest_framework.settings import api_settings

    rate = api_settings.DEFAULT_THROTTLE_RATES["agent"]
    limit, period = parse_rate(rate)  # type: ignore[arg-type]  # DRF's rates are "N/period" strings; its stubs type them as numbers
    if (world_size or 1) <= 1:
        return limit, period
    per_rank, per_rank_period = parse_rate(settings.AGENT_RATE_PER_RANK)
    ranks = min(world_size or 1, MAX_RATED_RANKS)
    scaled = -(-per_rank * ranks * period // per_rank_period)  # per the job's period, rounded up
    return max(limit, scaled), period


@cache
def rate_counter() -> RedisRateCounter | MemoryRateCounter:
    """One counter per process, so its Redis connection pool is shared by every request."""
    if settings.EMBEDDED:
        return MemoryRateCounter()
    return RedisRateCounter(settings.CHANNEL_PREFIX)


def agent_wait_seconds(job: Job) -> float:
    """Count one agent request of ``job``: 0 when allowed, else the seconds until its window
    ends (``agent_rate``). One Redis INCR on the process's connection pool.

    Fails open: with Redis down, metrics and heartbeats still land in PostgreSQL (and heartbeat
    replies still carry commands); a rate limit is not worth a NaN."""
    limit, period = agent_rate(job.world_size)
    try:
        return rate_counter().hit(f"agent:{job.pk}", limit, period)
    except Exception as error:  # redis-py's errors: the counter lives in Redis
        log.warning("agent rate limit not counted (Redis: %s); request allowed", error)
        return 0.0
