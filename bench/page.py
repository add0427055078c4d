"""The job page of a long run, and a point's way to the browser.

    DATABASE_URL=… REDIS_URL=… python bench/page.py

1. Server time (Django's test client in this process: the view and its queries, no network)
   to render the job page and to serve its chart series, for a job with 1,000,000 points per
   metric (loss, grad_norm, lr), written with COPY (``breakers.agent.store.copy_rows``) into the
   bench database once and reused. Goal: the page under a second. Median of several runs.
2. The browser twin of "a point ingested shows in the browser within 200 ms p95": Daphne
   serving the console, Chromium (Playwright) on the job page, a point POSTed over HTTP; the
   clock runs from just before the POST until the loss chart's data holds that step.
   Printed as median and p95; not a timed assertion.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime, timedelta

# A queue and key prefix of our own, before Django reads its settings (see bench/brake.py).
os.environ["BRAKELINE_CELERY_QUEUE"] = "brakeline-bench-page"
os.environ["BRAKELINE_CHANNEL_PREFIX"] = "brakeline-bench-page"

from _stack import daphne, median, percentile, set_up_django  # noqa: E402

POINTS = 1_000_000
NAMES = ("loss", "grad_norm", "lr")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def big_job():
    """The 1M-points-per-metric job (created once; COPY takes a few seconds per metric)."""
    from django.db import connection, transaction

    from breakers.agent.store import copy_rows
    from incidents.jobs import create_job
    from incidents.models import Job

    job = Job.objects.filter(team__name="bench", name="page-1m").first()
    if job is not None:
        return job
    job = create_job("bench", "page-1m").job
    start = datetime(2026, 1, 1, tzinfo=UTC)
    with transaction.atomic(), connection.cursor() as cursor:
        for name in NAMES:
            rows = (
                (
                    job.pk,
                    name,
                    s,
                    start + timedelta(seconds=s * 0.5),
                    2.0 + (s % 97) * 1e-3,
                    None,
                    0,
                )
                for s in range(POINTS)
            )
            copy_rows(cursor.cursor, rows)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE breakers_metricpoint")
    Job.objects.filter(pk=job.pk).update(current_step=POINTS - 1, status="running")
    return Job.objects.get(pk=job.pk)


def server_times(job, repeats: int) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from incidents.models import Membership, Role

    user, _ = get_user_model().objects.get_or_create(username="bench-page")
    Membership.objects.get_or_create(user=user, team=job.team, defaults={"role": Role.ONCALL})
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    cases = [("job page HTML", f"/jobs/{job.pk}/")]
    cases += [(f"series {n} (1M → 2000)", f"/api/v1/jobs/{job.pk}/series?names={n}") for n in NAMES]
    cases.append(
        (
            "series, zoomed 10k steps",
            f"/api/v1/jobs/{job.pk}/series?names=loss&from_step=500000&to_step=509999",
        )
    )
    print(f"Server time, {POINTS:,} points per metric, median of {repeats}:")
    for label, url in cases:
        timings = []
        for _ in range(repeats):
            started = time.perf_counter()
            response = client.get(url)
            timings.append(time.perf_counter() - started)
            assert response.status_code == 200, (url, response.status_code)
        print(f"  {label:<28} {median(timings) * 1000:8.1f} ms")


def browser_latency(samples: int) -> None:
    import json
    import urllib.request

    from django.contrib.auth import get_user_model
    from playwright.sync_api import sync_playwright

    from incidents.jobs import create_job
    from incidents.models import Membership, Role

    created = create_job("bench", f"page-live-{int(time.time())}")
    user = get_user_model().objects.get(username="bench-page")
    user.set_password("bench")
    user.save()
    Membership.objects.get_or_create(
        user=user, team=created.job.team, defaults={"role": Role.ONCALL}
    )

    def post(base: str, step: int) -> None:
        body = {"points": [{"name": "loss", "step": step, "value": 2.0 + step * 1e-3}]}
        request = urllib.request.Request(
            f"{base}/api/v1/agent/metrics",
            data=json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {created.raw_token}",
                "Content-Type": "application/json",
            },
        )
        urllib.request.urlopen(request, timeout=10).read()

    with daphne({"BRAKELINE_AGENT_RATE": "1000000/min"}) as base, sync_playwright() as p:
        post(base, 0)
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{base}/login/")
        page.fill("input[name=username]", "bench-page")
        page.fill("input[name=password]", "bench")
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/")
        page.goto(f"{base}/jobs/{created.job.pk}/")
        page.wait_for_function("document.getElementById('live-indicator').textContent === 'live'")
        page.wait_for_function("BrakelineCharts.lastStep('loss') === 0")
        latencies = []
        for step in range(1, samples + 1):
            started = time.perf_counter()
            post(base, step)
            page.wait_for_function(f"BrakelineCharts.lastStep('loss') >= {step}", polling="raf")
            latencies.append(time.perf_counter() - started)
            time.sleep(0.15)  # one point at a time, past the 100 ms coalescing interval
        browser.close()
    print(f"Point POSTed → in the browser's loss chart, {samples} points:")
    p95 = percentile(latencies, 0.95)
    print(f"  median {median(latencies) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--samples", type=int, default=40)
    args = parser.parse_args()
    # A database of its own (<name>_page_bench): the ingest bench leaves millions of dead rows
    # in the shared bench table, which would measure its bloat instead of this page.
    os.environ["DATABASE_URL"] = os.environ.get("DATABASE_URL", "") + "_page"
    set_up_django()
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's loop on this thread
    job = big_job()
    server_times(job, args.repeats)
    browser_latency(args.samples)
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.REDIS_URL).delete(settings.CELERY_TASK_DEFAULT_QUEUE)


if __name__ == "__main__":
    main()
