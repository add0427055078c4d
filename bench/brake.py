"""Time to brake: NaN posted → checkpoint_and_pause on the agent's websocket; and how long
after its deadline a silent job's heartbeat alert is raised.

    make bench-brake      (or: DATABASE_URL=… REDIS_URL=… python bench/brake.py)

Real parts only: Daphne serving the console, a Celery worker subprocess (solo pool), Celery
beat (the watchdog every second), PostgreSQL and Redis. Each brake try uses a fresh job (an
L3 alert stays firing, so a second NaN on the same job would rightly issue nothing) whose
agent holds a websocket open; the clock runs from just before the POST of the NaN point to
the moment the command frame arrives. Goals: p95 under 150 ms; heartbeat detection within
1.5 s of the deadline.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import urllib.request

# A queue and key prefix of our own, before Django reads its settings (see bench/evaluation.py).
os.environ["BRAKELINE_CELERY_QUEUE"] = "brakeline-bench"
os.environ["BRAKELINE_CHANNEL_PREFIX"] = "brakeline-bench"

from _stack import (  # noqa: E402
    daphne,
    median,
    percentile,
    set_up_django,
    start_beat,
    start_worker,
)

NAN_BODY = json.dumps({"points": [{"name": "loss", "step": 1, "value": "NaN"}]}).encode()


def post(url: str, token: str, body: bytes) -> None:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def brake_once(base_url: str, index: int) -> float | str:
    """Seconds from POSTing a NaN to the checkpoint_and_pause frame on the websocket."""
    from websockets.sync.client import connect

    from incidents.jobs import create_job

    created = create_job("bench", f"brake-{time.time_ns()}-{index}")
    token = created.raw_token
    ws_url = base_url.replace("http://", "ws://") + "/ws/agent/"
    with connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"}) as socket:
        started = time.perf_counter()
        post(f"{base_url}/api/v1/agent/metrics", token, NAN_BODY)
        try:
            message = json.loads(socket.recv(timeout=10))
        except TimeoutError:
            return missed_push(created.job.pk)
        elapsed = time.perf_counter() - started
    if message["command"]["kind"] != "checkpoint_and_pause":
        raise SystemExit(f"unexpected command {message}")
    return elapsed


def missed_push(job_id: int) -> float | str:
    """No frame in 10 s: say whether the brake was issued (push lost) or not (worker late)."""
    from breakers.models import Command

    issued = Command.objects.filter(job_id=job_id).exists()
    return "push lost (command issued; heartbeat reply delivers it)" if issued else "not issued"


def heartbeat_detection_once(base_url: str, index: int, timeout: float) -> float:
    """Seconds between a silent job's heartbeat deadline and its alert being raised."""
    from incidents.heartbeats import HEARTBEAT_RULE_KEY
    from incidents.jobs import create_job
    from incidents.models import Alert, Job

    created = create_job("bench", f"silent-{time.time_ns()}-{index}")
    Job.objects.filter(pk=created.job.pk).update(heartbeat_timeout_seconds=timeout)
    body = json.dumps({"step": 1, "status": "running"}).encode()
    post(f"{base_url}/api/v1/agent/heartbeat", created.raw_token, body)
    deadline = Job.objects.get(pk=created.job.pk).heartbeat_deadline
    give_up = time.monotonic() + timeout + 10
    while time.monotonic() < give_up:
        alert = Alert.objects.filter(job_id=created.job.pk, rule_key=HEARTBEAT_RULE_KEY).first()
        if alert is not None:
            return (alert.raised_at - deadline).total_seconds()
        time.sleep(0.02)
    raise SystemExit("no heartbeat alert: is beat running?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=200)
    parser.add_argument("--silences", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=1.0, help="heartbeat timeout, s")
    args = parser.parse_args()
    set_up_django()
    from config.celery import app

    app.control.purge()
    from incidents.models import Job

    # Earlier runs' jobs are braked and never acknowledged; left "pausing" they would make
    # every evaluation tick and watchdog run carry hundreds of them. A bench-only cleanup.
    Job.objects.filter(team__name="bench").exclude(status="terminated").update(
        status="terminated", heartbeat_deadline=None
    )
    with tempfile.TemporaryDirectory() as scratch, daphne() as base_url:
        worker, beat = start_worker(), start_beat(os.path.join(scratch, "beat-schedule"))
        try:
            time.sleep(3)  # worker and beat start-up
            for index in range(5):  # warm-up: connections, caches
                brake_once(base_url, -index - 1)
            outcomes = [brake_once(base_url, index) for index in range(args.tries)]
            silences = [
                heartbeat_detection_once(base_url, index, args.timeout)
                for index in range(args.silences)
            ]
        finally:
            for process in (beat, worker):
                process.terminate()
                process.wait(timeout=20)
    brakes = [outcome for outcome in outcomes if isinstance(outcome, float)]
    misses = [outcome for outcome in outcomes if not isinstance(outcome, float)]
    print(f"NaN POST → checkpoint_and_pause on the websocket, {len(outcomes)} tries:")
    for reason in sorted(set(misses)):
        print(f"  {misses.count(reason)} without a frame within 10 s: {reason}")
    print(
        f"  median {median(brakes) * 1000:.1f} ms, p95 {percentile(brakes, 0.95) * 1000:.1f} ms,"
        f" max {max(brakes) * 1000:.1f} ms (goal: p95 < 150 ms)"
    )
    print(
        f"Missed heartbeat detected after the deadline, {len(silences)} silences "
        f"(timeout {args.timeout:g} s, watchdog every 1 s):"
    )
    print(
        f"  median {median(silences):.3f} s, p95 {percentile(silences, 0.95):.3f} s, "
        f"max {max(silences):.3f} s (goal: within 1.5 s)"
    )


if __name__ == "__main__":
    main()
