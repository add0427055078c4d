"""A plain ``celery -A config worker`` (no ``-Q``) consumes every queue, the watchdog's first.

The queues are Celery's own setting (``CELERY_TASK_QUEUES``), so a worker started the way the
Celery documentation starts one runs the heartbeat watchdog too, not only docker-compose.yml's
worker with its explicit ``--queues``. Here a real worker and a real beat run as subprocesses
on queue names and a key prefix of their own (no other worker of the suite can help), an agent
heartbeats and goes silent, and its job gets the missed-heartbeat alert.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings

from config.celery import app
from incidents.heartbeats import HEARTBEAT_RULE_KEY
from incidents.models import Alert, Job
from tests.conftest import ROOT, server_environment

HEARTBEAT = "/api/v1/agent/heartbeat"


def test_without_q_a_worker_consumes_the_three_queues_in_priority_order():
    assert list(app.amqp.queues.consume_from) == settings.WORKER_QUEUES
    assert settings.WORKER_QUEUES == [
        settings.WATCHDOG_QUEUE,
        settings.CELERY_TASK_DEFAULT_QUEUE,
        settings.TICK_QUEUE,
    ]
    assert app.conf.broker_transport_options["queue_order_strategy"] == "priority"
    route = app.amqp.router.route({}, "control.watchdog")
    assert route["queue"].name == settings.WATCHDOG_QUEUE


def _start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "w") as output:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT)


def _stop(process: subprocess.Popen) -> None:
    process.terminate()  # warm shutdown: a task under way finishes and is acknowledged
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture
def plain_worker_and_beat(transactional_db, tmp_path) -> Iterator[Path]:
    """``celery -A config worker`` without -Q, and ``celery beat``; stopped before the flush."""
    name = f"brakeline-test-plain-{uuid.uuid4().hex[:8]}"
    env = server_environment(BRAKELINE_CELERY_QUEUE=name, BRAKELINE_CHANNEL_PREFIX=name)
    celery = [sys.executable, "-m", "celery", "-A", "config"]
    worker = _start(
        [*celery, "worker", "--loglevel", "INFO", "--concurrency", "1", "--hostname", f"{name}@%h"],
        tmp_path / "worker.log",
        env,
    )
    beat = _start(
        [*celery, "beat", "--loglevel", "INFO", "--schedule", str(tmp_path / "beat-schedule")],
        tmp_path / "beat.log",
        env,
    )
    try:
        yield tmp_path
    finally:
        _stop(beat)
        _stop(worker)
        client = redis.Redis.from_url(settings.REDIS_URL)
        for key in [*client.scan_iter(f"{name}*"), *client.scan_iter(f"_kombu.binding.{name}*")]:
            client.delete(key)
        client.close()


def wait_for_alert(job_id: int, logs: Path, deadline_seconds: float = 180.0) -> Alert:
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        alert = Alert.objects.filter(job_id=job_id, rule_key=HEARTBEAT_RULE_KEY).first()
        if alert is not None:
            return alert
        time.sleep(0.5)
    worker_log = (logs / "worker.log").read_text()[-4000:]
    beat_log = (logs / "beat.log").read_text()[-2000:]
    raise AssertionError(f"no alert\n--- worker\n{worker_log}\n--- beat\n{beat_log}")


@pytest.mark.django_db(transaction=True)
def test_a_plain_worker_detects_a_hung_job(agent, agent_post, plain_worker_and_beat):
    Job.objects.filter(pk=agent.job_id).update(heartbeat_timeout_seconds=2)
    for step in (10, 20):
        assert agent_post(HEARTBEAT, {"step": step, "status": "running"}).status_code == 200
    # … and then the agent goes silent: only the plain worker can notice.
    alert = wait_for_alert(agent.job_id, plain_worker_and_beat)
    assert (alert.severity, alert.metric, alert.first_step) == ("L3", "heartbeat", 20)
