"""kombu's Redis transport, with a channel that closes cleanly after Redis went away.

When Redis goes away, Celery's worker ``collect()``s its broker connection (which drops the
transport's link to the connection parameters) and then closes it. kombu 5.7's channel close
(``kombu.transport.redis.Channel.close``) can stop early on a connection error (reading the
reply of a BRPOP in flight, deleting an auto-delete queue) and stay open, holding the messages
delivered to it and not yet acknowledged. The next close tries to give them back, needs a new
Redis pool, finds no parameters and raises ``AttributeError: 'NoneType' object has no
attribute 'hostname'``. That is no connection error, so Celery calls it unrecoverable and the
worker exits: the fault suite saw both workers exit so after "Redis restarted mid-brake"
(health ``workers: 0``, the queue growing) under load.

Here a lost BRPOP reply is dropped and the close goes on; and a channel whose connection was
collected raises a connection error when it needs Redis, which every caller ignores, and the
consumer restarts. Redis keeps the unacknowledged messages and restores them after the
visibility timeout (unless it lost them too). config/celery.py installs this transport for
``redis://`` and ``rediss://``.
"""

from __future__ import annotations

from typing import Any

import redis.exceptions
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual import Empty

TRANSPORT = "config.broker:Transport"


# kombu-stubs declare none of the channel's private members used here.
class Channel(kombu_redis.Channel):
    def close(self) -> None:
        if self._in_poll:  # type: ignore[attr-defined]
            try:
                self._brpop_read()  # type: ignore[attr-defined]
            except Empty:
                pass
            except self.connection_errors:  # type: ignore[attr-defined]
                pass  # the reply went with the connection; the rest of the close must run
        super().close()

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection.client is None:  # collected: no parameters, and no Redis either
            raise redis.exceptions.ConnectionError("the broker connection was closed")
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[misc]


class Transport(kombu_redis.Transport):
    Channel = Channel


def install() -> None:
    """Every kombu connection of this process to ``redis://``/``rediss://`` uses Transport."""
    TRANSPORT_ALIASES["redis"] = TRANSPORT
    TRANSPORT_ALIASES["rediss"] = TRANSPORT
