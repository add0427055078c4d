"""How the console reaches PostgreSQL and Redis: one server each, or their fail-over set-ups.

- PostgreSQL under Patroni: ``BRAKELINE_DATABASE_HOSTS=host1:5432,host2:5432`` lists every
  member; the connection asks libpq for the one that takes writes
  (``target_session_attrs=read-write``), so after a switch-over or a fail-over every new
  connection reaches the new primary. ``DATABASE_URL`` still gives the user, password and
  database name.
- Redis under Sentinel: ``BRAKELINE_REDIS_SENTINELS=host1:26379,host2:26379,host3:26379`` lists
  the sentinels and ``BRAKELINE_REDIS_SENTINEL_MASTER`` (default ``brakeline``) the master they
  watch; every Redis client (Celery's broker, the channel layer, the cache, the console's own)
  asks them for the current master. ``REDIS_URL`` then gives only the database number and the
  password; its host is not used.

docs/deployment-ha.md describes the set-up and what the fault suite measured with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.redis_clients import redis_database


def patroni_database(database: Mapping[str, Any], hosts: list[tuple[str, int]]) -> dict[str, Any]:
    """The database settings with every member of the cluster, writes to the primary."""
    settings = dict(database)
    if not hosts:
        return settings
    settings["HOST"] = ",".join(host for host, _ in hosts)
    settings["PORT"] = ",".join(str(port) for _, port in hosts)
    settings.setdefault("OPTIONS", {})["target_session_attrs"] = "read-write"
    return settings


def channel_layer_host(url: str, sentinels: list[tuple[str, int]], master: str) -> dict:
    # redis-py 8 times socket reads out after 5 s by default (channels_redis#422); a quiet
    # subscription must not count as a dead connection.
    options = {"socket_timeout": 30, "socket_keepalive": True}
    if not sentinels:
        return {"address": url, **options}
    db, password = redis_database(url)
    return {
        "sentinels": sentinels,
        "master_name": master,
        "db": db,
        "password": password,
        **options,
    }


def celery_broker(url: str, sentinels: list[tuple[str, int]]) -> str:
    """kombu's URL: the Redis URL, or one ``sentinel://`` address per sentinel."""
    if not sentinels:
        return url
    db, password = redis_database(url)
    auth = f":{password}@" if password else ""
    return ";".join(f"sentinel://{auth}{host}:{port}/{db}" for host, port in sentinels)
