"""Liveness of the moving parts: when the watchdog beat last ran (a watchdog for the watchdog).

Redis in the server mode (every worker and web process sees the same value), process memory
in the embedded mode (one process holds everything).
"""

from __future__ import annotations

import time
from functools import cache

from django.conf import settings

from core.redis_clients import redis_client

_memory: dict[str, float] = {}


@cache
def _redis():
    return redis_client()


def _key(name: str) -> str:
    return f"{settings.CHANNEL_PREFIX}:liveness:{name}"


def record(name: str, at: float | None = None) -> None:
    at = time.time() if at is None else at
    if settings.EMBEDDED:
        _memory[name] = at
    else:
        _redis().set(_key(name), at, ex=86400)


def last(name: str) -> float | None:
    if settings.EMBEDDED:
        return _memory.get(name)
    raw = _redis().get(_key(name))
    return float(raw) if raw is not None else None


def queue_depth(queue: str) -> int | None:
    """Messages waiting in the Celery queue (Redis list of the same name); None if unknown."""
    if settings.EMBEDDED:
        return 0
    return int(_redis().llen(queue))
