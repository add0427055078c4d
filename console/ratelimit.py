"""Fixed-window rate counters: Redis in the server mode, process memory when embedded."""

from __future__ import annotations

import threading
import time
from functools import cache

from django.conf import settings

from core.redis_clients import redis_client

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


@cache
def rate_counter() -> RedisRateCounter | MemoryRateCounter:
    """One counter per process, so its Redis connection pool is shared by every request."""
    if settings.EMBEDDED:
        return MemoryRateCounter()
    return RedisRateCounter(settings.CHANNEL_PREFIX)
