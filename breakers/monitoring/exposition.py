"""Brakeline's own state for Prometheus, with prometheus_client (docs/monitoring.md "Metrics").

Every figure is read from the database and Redis when Prometheus scrapes, by a custom
collector: the web process, the workers and beat are separate processes (often on separate
hosts), so counters kept in one process's memory would show only that process's share and
reset with it. The tables already hold every command, alert and delivery; a scrape asks them.

Histograms are cumulative over the rows (a row once counted stays counted, so Prometheus'
``rate()`` and ``histogram_quantile()`` work). The evaluation lag is the jobs' lag *now*, a
gauge histogram (its buckets go down as the backlog drains).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from django.conf import settings
from django.db.models import Count
from django.utils import timezone
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from breakers.control import duties, liveness
from breakers.control.hearing import heard_until, hearing_state
from breakers.control.heartbeats import WATCHED_STATUSES
from breakers.control.watchdog import BEAT
from breakers.models import (
    Command,
    EvaluationState,
    ExternalAlert,
    ExternalAlertStatus,
)
from breakers.storage.points import oldest_after
from incidents.heartbeats import HEARTBEAT_RULE_KEY, past_deadline
from incidents.models import (
    ACTIVE_ALERT_STATUSES,
    TRAINING_JOB_STATUSES,
    UNHELD_JOB_STATUSES,
    ActorKind,
    Alert,
    Delivery,
    Job,
)

BRAKE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
LAG_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)


def registry() -> CollectorRegistry:
    """A registry with Brakeline's collector only (no process metrics of this one process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrakelineCollector())
    return registry


class BrakelineCollector:
    def collect(self) -> Iterator[Metric]:
        yield _alerts_firing()
        yield _commands()
        yield _brake_latency()
        yield from _evaluation_lag()
        yield from _heartbeats()
        yield from _queues()
        yield _deliveries()
        yield _watchdog_age()
        yield _external_alerts()
        yield _duty_failures()


def _alerts_firing() -> Metric:
    metric = GaugeMetricFamily(
        "brakeline_alerts_firing",
        "Active (firing or acknowledged) alerts",
        labels=["level", "layer"],
    )
    counts = {
        (level, layer): 0
        for level in ("L1", "L2", "L3", "L4")
        for layer in ("health", "stability", "performance")
    }
    rows = Alert.objects.filter(status__in=ACTIVE_ALERT_STATUSES).values("severity", "layer")
    for row in rows.annotate(n=Count("id")):
        counts[(row["severity"], row["layer"])] = row["n"]
    for (level, layer), n in sorted(counts.items()):
        metric.add_metric([level, layer], n)
    return metric


def _commands() -> Metric:
    metric = CounterMetricFamily(
        "brakeline_commands",
        "Commands issued, by kind and current status",
        labels=["kind", "status"],
    )
    for row in Command.objects.values("kind", "status").annotate(n=Count("id")).order_by():
        metric.add_metric([row["kind"], row["status"]], row["n"])
    return metric


def _brake_latency() -> Metric:
    """From an alert being raised to the job acknowledging the system's command for it."""
    rows = Command.objects.filter(
        issued_by_kind=ActorKind.SYSTEM, alert__isnull=False, acknowledged_at__isnull=False
    ).values_list("acknowledged_at", "alert__raised_at")
    seconds = [
        max(0.0, (acked - raised).total_seconds())
        for acked, raised in rows.iterator()
        if acked is not None
    ]
    return _histogram(
        HistogramMetricFamily,
        "brakeline_brake_latency_seconds",
        "From an alert raised to the job acknowledging its automatic brake",
        seconds,
        BRAKE_BUCKETS,
    )


def _evaluation_lag() -> Iterator[Metric]:
    """Per running job: the age of its oldest point not yet evaluated (0 when caught up)."""
    running = {*TRAINING_JOB_STATUSES, *UNHELD_JOB_STATUSES}
    cursors = EvaluationState.objects.filter(job__status__in=running)
    now = timezone.now()
    lags = []
    for job_id, cursor in cursors.values_list("job_id", "cursor"):
        oldest = oldest_after(job_id, cursor)  # one probe per index: running jobs are few
        lags.append(max(0.0, (now - oldest).total_seconds()) if oldest else 0.0)
    yield _histogram(
        GaugeHistogramMetricFamily,
        "brakeline_evaluation_lag_seconds",
        "Running jobs by the age of their oldest point not yet evaluated",
        lags,
        LAG_BUCKETS,
    )
    maximum = GaugeMetricFamily(
        "brakeline_evaluation_lag_max_seconds", "The largest evaluation lag of any running job"
    )
    maximum.add_metric([], max(lags, default=0.0))
    yield maximum


def _histogram(family, name: str, documentation: str, values: Sequence[float], bounds) -> Metric:
    buckets = [(str(b), sum(1 for v in values if v <= b)) for b in bounds]
    buckets.append(("+Inf", len(values)))
    if family is HistogramMetricFamily:
        return family(name, documentation, buckets=buckets, sum_value=sum(values))
    return family(name, documentation, buckets=buckets, gsum_value=sum(values))


def _heartbeats() -> Iterator[Metric]:
    misses = CounterMetricFamily(
        "brakeline_heartbeat_deadline_misses", "Jobs that missed their heartbeat deadline"
    )
    misses.add_metric([], Alert.objects.filter(rule_key=HEARTBEAT_RULE_KEY).count())
    yield misses
    # Counted from the deadlines themselves, not from the watchdog's claims: right while the
    # watchdog (its beat) is away too.
    overdue = GaugeMetricFamily("brakeline_jobs_heartbeat_overdue", "Jobs silent right now")
    heard = heard_until(timezone.now())
    silent = Job.objects.filter(past_deadline(heard), status__in=WATCHED_STATUSES)
    overdue.add_metric([], silent.count())
    yield overdue
    yield from _hearing()


def _hearing() -> Iterator[Metric]:
    state = hearing_state()
    age = GaugeMetricFamily(
        "brakeline_hearing_beacon_age_seconds",
        "Seconds since a web process last said it can hear agents (NaN: no beacon yet)",
    )
    age.add_metric([], float("nan") if state["age_seconds"] is None else state["age_seconds"])
    yield age
    outages = CounterMetricFamily(
        "brakeline_console_outages", "Times the console could not hear its agents (> 2 s)"
    )
    outages.add_metric([], float(state["outages"] or 0))
    yield outages
    deaf = CounterMetricFamily(
        "brakeline_console_deaf_seconds", "Seconds the console could not hear its agents"
    )
    deaf.add_metric([], float(state["deaf_seconds"] or 0.0))
    yield deaf


def _queues() -> Iterator[Metric]:
    depth = GaugeMetricFamily("brakeline_queue_depth", "Celery tasks waiting", labels=["queue"])
    up = GaugeMetricFamily(
        "brakeline_queue_readable", "1 when Redis answered for the queue", labels=["queue"]
    )
    for queue in settings.WORKER_QUEUES:
        n = liveness.queue_depth(queue)
        depth.add_metric([queue], n if n is not None else float("nan"))
        up.add_metric([queue], 0 if n is None else 1)
    yield depth
    yield up


def _deliveries() -> Metric:
    metric = CounterMetricFamily(
        "brakeline_notification_deliveries",
        "Notification deliveries by channel and outcome",
        labels=["channel", "status"],
    )
    for row in Delivery.objects.values("channel", "status").annotate(n=Count("id")).order_by():
        metric.add_metric([row["channel"], row["status"]], row["n"])
    return metric


def _watchdog_age() -> Metric:
    """Seconds since the watchdog last ran; +Inf when it never ran (or Redis cannot say)."""
    metric = GaugeMetricFamily(
        "brakeline_watchdog_age_seconds", "Seconds since the heartbeat watchdog last ran"
    )
    last = liveness.last(BEAT)
    metric.add_metric([], time.time() - last if last is not None else float("inf"))
    return metric


def _external_alerts() -> Metric:
    metric = GaugeMetricFamily(
        "brakeline_external_alerts_firing",
        "Firing outside alerts, routed to a job or not",
        labels=["routed"],
    )
    firing = ExternalAlert.objects.filter(status=ExternalAlertStatus.FIRING)
    metric.add_metric(["true"], firing.filter(job__isnull=False).count())
    metric.add_metric(["false"], firing.filter(job__isnull=True).count())
    return metric


def _duty_failures() -> Metric:
    """One job's part of a periodic duty that failed (the others went on): see
    ``breakers.control.duties``."""
    metric = CounterMetricFamily(
        "brakeline_duty_failures",
        "Parts of a periodic duty (one job's) that failed; the other jobs' went on",
        labels=["duty"],
    )
    for duty, count in duties.failures().items():
        metric.add_metric([duty], count)
    return metric
