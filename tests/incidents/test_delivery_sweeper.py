"""The delivery sweeper: a page whose worker died mid-send goes out again, and only once.

The worker that sends is a real ``celery worker`` process, SIGKILLed while the fake provider
(a real HTTP server on 127.0.0.1, tests/support/notify.py) holds its request open. The provider
honours the Idempotency-Key header as a provider that supports it would: two requests with one
key are one page. The sweeper runs where it runs in production, on the beat.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from config.celery import app
from incidents.jobs import create_job
from incidents.models import Delivery, DeliveryStatus
from incidents.notifications.delivery import attempt_delivery, lease
from incidents.notifications.sweep import sweep_deliveries
from tests.conftest import ROOT, server_environment
from tests.support.notify import Receiver
from tests.support.waiting import wait_for

LEASE_SECONDS = 6.0  # the subprocesses' lease: three times their 2 s HTTP timeout


def make_delivery(receiver_url: str | None = None) -> Delivery:
    job = create_job("research", f"job-{uuid.uuid4().hex[:6]}", "training").job
    person = get_user_model().objects.create(username=f"oncall-{uuid.uuid4().hex[:6]}")
    return Delivery.objects.create(
        team=job.team,
        recipient=person,
        channel="sms",
        address="+15551110001",
        purpose="test",
        first_line="L3 loss is NaN",
        body="L3 loss is NaN at step 9",
        lease_until=lease(timezone.now()),
    )


def pages(receiver: Receiver) -> set[str]:
    """What the person's phone showed: one message per idempotency key."""
    return {
        r.headers.get("Idempotency-Key", f"no key {i}") for i, r in enumerate(receiver.requests)
    }


# --- The lease and its compare-and-swap, in this process ------------------------------------


@pytest.mark.django_db
def test_an_expired_lease_is_requeued_once_with_the_next_attempt(
    django_capture_on_commit_callbacks,
):
    delivery = make_delivery()
    Delivery.objects.filter(pk=delivery.pk).update(attempts=1)  # claimed by a worker that died
    later = timezone.now() + timedelta(seconds=settings.NOTIFY_DELIVERY_LEASE_SECONDS + 1)
    assert sweep_deliveries(now=timezone.now()) == []  # the lease has not run out
    with django_capture_on_commit_callbacks() as callbacks:
        assert sweep_deliveries(now=later) == [delivery.pk]
    assert sweep_deliveries(now=later) == []  # a second sweeper (or beat) finds it taken
    assert len(callbacks) == 1
    assert Delivery.objects.get(pk=delivery.pk).lease_until > later


@pytest.mark.django_db
def test_finished_and_cancelled_deliveries_are_never_swept():
    later = timezone.now() + timedelta(seconds=settings.NOTIFY_DELIVERY_LEASE_SECONDS + 1)
    for status in (DeliveryStatus.SENT, DeliveryStatus.FAILED, DeliveryStatus.CANCELLED):
        Delivery.objects.filter(pk=make_delivery().pk).update(status=status)
    assert sweep_deliveries(now=later) == []


@pytest.fixture
def provider(receiver: Receiver, settings) -> Receiver:
    settings.NOTIFY_PROVIDER_BASE_URL = receiver.url + "/2010-04-01/Accounts/AC1"
    settings.NOTIFY_PROVIDER_FROM_NUMBER = "+15550000000"
    return receiver


def hold_first_request(receiver: Receiver) -> tuple[threading.Event, threading.Event]:
    """The provider keeps its first request open until released: a send under way."""
    arrived, release = threading.Event(), threading.Event()

    def hold(_received) -> None:
        if not arrived.is_set():
            arrived.set()
            release.wait(60)

    receiver.on_request = hold
    return arrived, release


@pytest.mark.django_db(transaction=True)
def test_a_sweep_during_a_live_send_leaves_it_alone(provider):
    delivery = make_delivery()
    arrived, release = hold_first_request(provider)
    sender = threading.Thread(
        target=attempt_delivery, args=(delivery.pk,), kwargs={"expected_attempts": 0}
    )
    sender.start()
    assert arrived.wait(30)
    assert sweep_deliveries() == []  # the worker is alive and within its lease
    release.set()
    sender.join(30)
    assert Delivery.objects.get(pk=delivery.pk).status == DeliveryStatus.SENT
    assert sweep_deliveries(now=timezone.now() + timedelta(days=1)) == []
    assert len(provider.requests) == 1


# --- A real worker process, SIGKILLed mid-send ----------------------------------------------


@pytest.fixture
def subprocess_celery(transactional_db, tmp_path, provider) -> Iterator:
    """Start workers (and their beat) on queues of their own, with a short lease."""
    name = f"brakeline-test-sweep-{uuid.uuid4().hex[:8]}"
    env = server_environment(
        BRAKELINE_CELERY_QUEUE=name,
        BRAKELINE_CHANNEL_PREFIX=name,
        BRAKELINE_NOTIFY_PROVIDER_URL=settings.NOTIFY_PROVIDER_BASE_URL,
        BRAKELINE_NOTIFY_FROM_NUMBER="+15550000000",
        BRAKELINE_NOTIFY_HTTP_TIMEOUT_SECONDS="2",
        BRAKELINE_NOTIFY_LEASE_SECONDS=str(LEASE_SECONDS),
    )
    started: list[subprocess.Popen] = []

    def start(label: str, *, beat: bool = False) -> subprocess.Popen:
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            "INFO",
            "--hostname",
            f"{label}-{name}@%h",
            "--without-gossip",
            "--without-mingle",
        ]
        if beat:
            command += ["--beat", "--schedule", str(tmp_path / "beat-schedule")]
        with open(tmp_path / f"{label}.log", "w") as log:
            process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
        started.append(process)
        return process

    start.queue = name  # type: ignore[attr-defined]
    start.logs = tmp_path  # type: ignore[attr-defined]
    try:
        yield start
    finally:
        for process in started:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        client = redis.Redis.from_url(settings.REDIS_URL)
        for key in [*client.scan_iter(f"{name}*"), *client.scan_iter(f"_kombu.binding.{name}*")]:
            client.delete(key)
        client.close()


def logs_of(directory: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(directory.glob("*.log"))
    )


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_send_is_swept_and_the_page_goes_out_once(provider, subprocess_celery):
    delivery = make_delivery()
    arrived, release = hold_first_request(provider)
    doomed = subprocess_celery("doomed")
    app.send_task(
        "notifications.send_delivery", args=(delivery.pk, 0), queue=subprocess_celery.queue
    )
    assert arrived.wait(120), logs_of(subprocess_celery.logs)  # the worker is mid-send
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(30)
    release.set()  # the provider took the page; its answer goes to a dead socket
    row = Delivery.objects.get(pk=delivery.pk)
    assert (row.status, row.attempts) == (DeliveryStatus.QUEUED, 1)  # orphaned: nobody owns it

    subprocess_celery("rescuer", beat=True)  # a new worker, and the beat with the sweeper
    wait_for(
        lambda: Delivery.objects.get(pk=delivery.pk).status != DeliveryStatus.QUEUED,
        "the sweeper to re-queue the orphaned delivery and a worker to send it",
        timeout=180,
        interval=0.2,
        context=lambda: logs_of(subprocess_celery.logs),
    )
    row = Delivery.objects.get(pk=delivery.pk)
    assert (row.status, row.attempts) == (DeliveryStatus.SENT, 2), logs_of(subprocess_celery.logs)
    keys = [r.headers.get("Idempotency-Key") for r in provider.to("/Messages.json")]
    assert keys == [f"brakeline-delivery-{delivery.pk}"] * 2  # sent again, with the same key
    assert len(pages(provider)) == 1  # … so the person was paged once
