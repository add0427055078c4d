"""The console at a thousand ranks: each page a person opens during a silence, server time and
size, for a job of 1,000 ranks against a job of 2 ranks seeded alike in the same run.

    DATABASE_URL=… REDIS_URL=… python bench/ranks_console.py [--repeats 7] [--steps 200]

Both jobs come from bench/_thousand.py: one ``JobRank`` row per rank, every rank's loss stored
through the ingest service (a batch per rank), 7 silent ranks (the 2-rank job: its rank 1),
2 stragglers, and the heartbeat watchdog's real alert with its incident. Server time is Django's
test client in this process (the view, its queries and the template; no network), the median
of ``--repeats``; the size is the body's bytes. The ratio is the 1,000-rank job's median over
the 2-rank job's: what a thousand ranks cost each page.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

# A queue and key prefix of our own, before Django reads its settings (see bench/brake.py).
os.environ["BRAKELINE_CELERY_QUEUE"] = "brakeline-bench-ranks-console"
os.environ["BRAKELINE_CHANNEL_PREFIX"] = "brakeline-bench-ranks-console"

from _stack import median, set_up_django  # noqa: E402
from _thousand import seed_thousand  # noqa: E402


def pages(job_id: int, incident_id: int | None, pick: int) -> list[tuple[str, str]]:
    """(label, URL) of every page and partial measured, for one job."""
    job, series = f"/jobs/{job_id}/", f"/api/v1/jobs/{job_id}/series?names=loss"
    cases = [
        ("job page", job),
        ("ranks partial, silent first", f"{job}?partial=ranks"),
        ("ranks partial, page 10 slowest", f"{job}?partial=ranks&sort=slowest&page=10"),
        ("ranks partial, search a rank", f"{job}?partial=ranks&q={pick}"),
        ("state partial", f"{job}?partial=state"),
        (f"series loss, rank {pick} + band", f"{series}&rank={pick}"),
        ("series loss, 16 rank lines", f"{series}&ranks={','.join(map(str, range(16)))}&spread=0"),
        ("alerts page", "/alerts/"),
    ]
    if incident_id is not None:
        cases += [
            ("incident page", f"/incidents/{incident_id}/"),
            ("review page", f"/incidents/{incident_id}/review/"),
        ]
    return cases


def measure(client, url: str, repeats: int) -> tuple[float, int]:
    """Median seconds and the body's bytes of ``repeats`` GETs (one warm-up first)."""
    client.get(url)
    timings, size = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        response = client.get(url)
        timings.append(time.perf_counter() - started)
        assert response.status_code == 200, (url, response.status_code)
        size = len(response.content)
    return median(timings), size


def viewer(team_id: int):
    """A signed-in on-call person of one job's team (its alerts page: that team's alerts)."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from incidents.models import Membership, Role

    user = get_user_model().objects.create_user(f"bench-ranks-{team_id}")
    Membership.objects.create(user=user, team_id=team_id, role=Role.ONCALL)
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return client


def report(small, large, repeats: int) -> None:
    from incidents.models import Alert, Job

    teams = dict(
        Job.objects.values_list("pk", "team_id").filter(pk__in=[small.job_id, large.job_id])
    )
    small_client, large_client = viewer(teams[small.job_id]), viewer(teams[large.job_id])
    said = Alert.objects.get(pk=large.alert_id).description.split(":")[0]
    print(f"The heartbeat alert of the 1,000-rank job: {said!r}")
    print(f"Server time and size, median of {repeats} (2 ranks → 1,000 ranks):")
    print(f"  {'':<34} {'2 ranks':>10} {'1,000 ranks':>12} {'ratio':>6} {'bytes':>16}")
    for (label, url_small), (_, url_large) in zip(
        pages(small.job_id, small.incident_id, 1),
        pages(large.job_id, large.incident_id, 713),
        strict=True,
    ):
        time_small, size_small = measure(small_client, url_small, repeats)
        time_large, size_large = measure(large_client, url_large, repeats)
        print(
            f"  {label:<34} {time_small * 1000:8.1f} ms {time_large * 1000:9.1f} ms "
            f"{time_large / time_small:6.2f} {size_small:>7,} → {size_large:>7,}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=200, help="loss points per rank")
    args = parser.parse_args()
    set_up_django()
    logging.getLogger("brakeline.requests").setLevel(logging.WARNING)  # a line per GET
    stamp = time.time_ns()
    started = time.perf_counter()
    large = seed_thousand(f"bench-ranks-1000-{stamp}", "llm-1k", steps=args.steps)
    seeded = time.perf_counter() - started
    small = seed_thousand(f"bench-ranks-2-{stamp}", "llm-2", world=2, steps=args.steps)
    print(f"Seeded 1,000 ranks × {args.steps} loss points (ingest service): {seeded:.1f} s")
    report(small, large, args.repeats)
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.REDIS_URL).delete(settings.CELERY_TASK_DEFAULT_QUEUE)


if __name__ == "__main__":
    main()
