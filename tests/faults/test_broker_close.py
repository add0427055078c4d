"""A worker survives Redis going away while it holds unacknowledged messages (config/broker.py):
the close that Celery's consumer runs on a lost connection must raise nothing but a connection
error, or Celery calls it unrecoverable and the worker exits.

A real redis-server of its own (free port), a real kombu connection and channel. The stock
transport is checked too: the day kombu fixes its close, that test fails.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest
from kombu import Connection, Exchange, Queue
from kombu.common import ignore_errors
from kombu.transport import redis as kombu_redis

from bench._faultstack import free_port, port_open, wait_until
from config import broker


@pytest.fixture
def redis_port() -> Iterator[int]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed")
    port = free_port()
    server = subprocess.Popen(
        [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: port_open(port), "Redis to listen")
        yield port
    finally:
        server.kill()
        server.wait(30)


def _close_after_collect(port: int, transport: type) -> None:
    """A message delivered and not acknowledged, Redis shut down, the connection collected (as
    Celery's consumer collects it) while the channel is still open, then the channel closed
    under ``ignore_errors`` as Celery closes it: anything but a connection error escapes."""
    connection = Connection(hostname="127.0.0.1", port=port, transport=transport)
    queue = Queue("held", Exchange("held"), routing_key="held")
    with connection.Producer() as producer:
        producer.publish({"n": 1}, exchange=queue.exchange, routing_key="held", declare=[queue])
    held = []
    consumer = connection.Consumer([queue], callbacks=[lambda body, message: held.append(body)])
    consumer.consume()
    connection.drain_events(timeout=30)
    assert held == [{"n": 1}]  # delivered, never acknowledged
    channel = connection.default_channel
    subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True)
    wait_until(lambda: not port_open(port), "Redis to go away")
    # collect()'s last step; the channel's own close had stopped on a connection error.
    connection._do_close_transport()
    ignore_errors(connection, channel.close)


def test_a_channel_closed_after_its_connection_was_collected_raises_no_other_error(
    redis_port,
):
    _close_after_collect(redis_port, broker.Transport)


def test_kombus_own_channel_raises_attribute_error_there(redis_port):
    """What made the workers exit; the day kombu fixes it, this fails and broker.py can go."""
    with pytest.raises(AttributeError, match="hostname"):
        _close_after_collect(redis_port, kombu_redis.Transport)


def test_the_project_transport_is_what_redis_urls_use():
    with Connection("redis://127.0.0.1:1/0") as connection:
        assert isinstance(connection.transport, broker.Transport)
