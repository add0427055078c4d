"""The console's own Redis clients: the server named by ``REDIS_URL``, or the master that
Redis Sentinel names (config/services.py). A client of a Sentinel set-up asks the sentinels
for the master when it connects and again after a connection error, so a fail-over costs the
requests in flight, not the process."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
from django.conf import settings
from redis.sentinel import Sentinel, SentinelConnectionPool

# How long a question to a sentinel may take: they answer at once or are away.
SENTINEL_TIMEOUT = 1.0


def redis_database(url: str) -> tuple[int, str | None]:
    """The database number and password a Redis URL names."""
    parts = urlsplit(url)
    path = parts.path.lstrip("/")
    return (int(path) if path.isdigit() else 0), parts.password


def redis_client(**options: Any) -> redis.Redis:
    """A client of the console's Redis (its current master under Sentinel)."""
    if not settings.REDIS_SENTINELS:
        return redis.Redis.from_url(settings.REDIS_URL, **options)
    db, password = redis_database(settings.REDIS_URL)
    sentinel = Sentinel(
        settings.REDIS_SENTINELS,
        sentinel_kwargs={"socket_timeout": SENTINEL_TIMEOUT},
        socket_timeout=options.pop("socket_timeout", None),
    )
    return sentinel.master_for(settings.REDIS_SENTINEL_MASTER, db=db, password=password, **options)


class SentinelCachePool(SentinelConnectionPool):
    """Django's Redis cache builds its pools with ``pool_class.from_url(location, **options)``:
    this one takes the master from the sentinels instead of the location's host."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SentinelCachePool:
        db, password = redis_database(url)
        sentinel = Sentinel(
            settings.REDIS_SENTINELS, sentinel_kwargs={"socket_timeout": SENTINEL_TIMEOUT}
        )
        return cls(settings.REDIS_SENTINEL_MASTER, sentinel, db=db, password=password, **options)
