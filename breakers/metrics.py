"""Metric history for charts: downsampled in SQL, with the loss rule's band and markers.

A run streams up to millions of points per metric; a chart is ~1,000 pixels wide. Each series
is cut into at most ``max_points / 2`` buckets of whole steps and each bucket keeps its finite
minimum and maximum *at the steps where they occurred* (min/max downsampling: every spike and
dip survives, which averaging or LTTB's area heuristic may hide). Non-finite values are never
downsampled away: each bucket also keeps its first NaN, +Inf and -Inf as their own points, so a
NaN at step 4,512 of a million is still drawn. PostgreSQL does the bucketing in one grouped
scan of the (job, name, step) index range; ``min(ARRAY[value, step, epoch])`` carries the
arg-min along without a sort.

The band is the loss-deviation rule's baseline, mean ± k·σ of the preceding ``window`` finite
points (what the detector judges each point against, σ floored like the detector's). It is
computed from per-bucket count/Σx/Σx² returned by the same query: exact when the view is not
downsampled (one point per bucket), and the same statistic over whole buckets — the preceding
buckets holding at least ``window`` points — when it is.
"""

from __future__ import annotations

import bisect
import fnmatch
import math
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import OuterRef, Subquery

from breakers.detection.engine import RuleSpec
from breakers.detection.rules import effective_rules
from breakers.models import Command, MetricPoint
from core.nonfinite import encode
from incidents.models import Alert, Job, TimelineEntry, TimelineKind

TABLE = MetricPoint._meta.db_table
MAX_POINTS_LIMIT = 10_000
MAX_NAMES = 200
FINITE = "value NOT IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8)"

_BUCKETS_SQL = f"""
SELECT (step - %(origin)s) / %(width)s AS bucket,
  min(ARRAY[value, step, date_part('epoch', time)]) FILTER (WHERE {FINITE}),
  max(ARRAY[value, step, date_part('epoch', time)]) FILTER (WHERE {FINITE}),
  count(*) FILTER (WHERE {FINITE}),
  sum(value) FILTER (WHERE {FINITE}),
  sum(value * value) FILTER (WHERE {FINITE}),
  min(ARRAY[step, date_part('epoch', time)]) FILTER (WHERE value = 'NaN'::float8),
  min(ARRAY[step, date_part('epoch', time)]) FILTER (WHERE value = 'Infinity'::float8),
  min(ARRAY[step, date_part('epoch', time)]) FILTER (WHERE value = '-Infinity'::float8)
FROM {TABLE}
WHERE job_id = %(job)s AND name = %(name)s AND step BETWEEN %(low)s AND %(high)s
GROUP BY bucket ORDER BY bucket
"""

_NAMES_SQL = f"""
WITH RECURSIVE names(name) AS (
  (SELECT name FROM {TABLE} WHERE job_id = %(job)s ORDER BY name LIMIT 1)
  UNION ALL
  SELECT (SELECT m.name FROM {TABLE} m WHERE m.job_id = %(job)s AND m.name > names.name
          ORDER BY m.name LIMIT 1)
  FROM names WHERE names.name IS NOT NULL
)
SELECT name FROM names WHERE name IS NOT NULL LIMIT {MAX_NAMES}
"""


@dataclass
class Bucket:
    index: int
    points: list[tuple[int, float, float | str]]  # (step, epoch seconds, value), step order
    count: int  # finite points
    total: float
    squares: float


@dataclass(frozen=True)
class BandRule:
    """The parameters of the rule whose band is drawn (a ``deviation`` rule on the metric)."""

    key: str
    k: float
    window: int
    sigma_floor_rel: float
    sigma_floor_abs: float


def metric_names(job_id: int) -> list[str]:
    """Distinct metric names of a job: a loose index scan, one index probe per name."""
    if connection.vendor != "postgresql":
        names = MetricPoint.objects.filter(job_id=job_id).values_list("name", flat=True)
        return sorted(set(names))[:MAX_NAMES]
    with connection.cursor() as cursor:
        cursor.execute(_NAMES_SQL, {"job": job_id})
        return [row[0] for row in cursor.fetchall()]


def step_range(job_id: int, name: str) -> tuple[int, int] | None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT min(step), max(step) FROM {TABLE} WHERE job_id = %s AND name = %s",
            [job_id, name],
        )
        low, high = cursor.fetchone()
    return None if low is None else (int(low), int(high))


def _bucket_from_row(row: tuple) -> Bucket:
    index, low, high, count, total, squares, nan, pos_inf, neg_inf = row
    points: dict[tuple[int, Any], tuple[int, float, float | str]] = {}
    for extreme in (low, high):
        if extreme is not None:
            value, step, epoch = extreme
            points[(int(step), value)] = (int(step), epoch, value)
    for marker, label in ((nan, "NaN"), (pos_inf, "Infinity"), (neg_inf, "-Infinity")):
        if marker is not None:
            points[(int(marker[0]), label)] = (int(marker[0]), marker[1], label)
    return Bucket(
        index=int(index),
        points=sorted(points.values(), key=lambda p: (p[0], p[1])),
        count=int(count or 0),
        total=float(total or 0.0),
        squares=float(squares or 0.0),
    )


def fetch_buckets(
    job_id: int, name: str, *, origin: int, width: int, low: int, high: int
) -> list[Bucket]:
    """One grouped scan of the series between ``low`` and ``high`` (inclusive)."""
    if connection.vendor != "postgresql":
        return _fetch_buckets_python(job_id, name, origin=origin, width=width, low=low, high=high)
    with transaction.atomic(), connection.cursor() as cursor:
        # JIT compilation costs more than it saves on this one-pass aggregate (≈ +30 %).
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(
            _BUCKETS_SQL,
            {
                "origin": origin,
                "width": width,
                "job": job_id,
                "name": name,
                "low": low,
                "high": high,
            },
        )
        return [_bucket_from_row(row) for row in cursor.fetchall()]


def _fetch_buckets_python(
    job_id: int, name: str, *, origin: int, width: int, low: int, high: int
) -> list[Bucket]:
    """The embedded SQLite mode: the same buckets computed in Python (small demo runs)."""
    rows: dict[int, list] = {}
    points = MetricPoint.objects.filter(
        job_id=job_id, name=name, step__gte=low, step__lte=high
    ).values_list("step", "time", "value")
    for step, time, value in points.iterator():
        rows.setdefault((step - origin) // width, []).append((step, time.timestamp(), value))
    buckets = []
    for index in sorted(rows):
        finite = [p for p in rows[index] if math.isfinite(p[2])]
        low_p = min(finite, key=lambda p: (p[2], p[0]), default=None)
        high_p = max(finite, key=lambda p: (p[2], p[0]), default=None)
        markers = []
        for test in (math.isnan, lambda v: v == math.inf, lambda v: v == -math.inf):
            hits = [p for p in rows[index] if test(p[2])]
            markers.append([min(hits)[0], min(hits)[1]] if hits else None)
        row = (
            index,
            [low_p[2], low_p[0], low_p[1]] if low_p else None,
            [high_p[2], high_p[0], high_p[1]] if high_p else None,
            len(finite),
            sum(p[2] for p in finite),
            sum(p[2] * p[2] for p in finite),
            *markers,
        )
        buckets.append(_bucket_from_row(row))
    return buckets


def band_rule(team_id: int, metric: str = "loss") -> BandRule | None:
    """The team's enabled ``deviation`` rule on ``metric`` with a window in points, if any."""
    for spec in effective_rules(team_id):
        if spec.enabled and spec.detector == "deviation" and _matches(spec, metric):
            params = spec.params
            if params.get("window"):
                return BandRule(
                    key=spec.key,
                    k=float(params.get("k", 3.0)),
                    window=int(params["window"]),
                    sigma_floor_rel=float(params.get("sigma_floor_rel", 1e-4)),
                    sigma_floor_abs=float(params.get("sigma_floor_abs", 1e-12)),
                )
    return None


def _matches(spec: RuleSpec, metric: str) -> bool:
    return any(fnmatch.fnmatchcase(metric, pattern) for pattern in spec.metric.split("|"))


def band_for(buckets: list[Bucket], rule: BandRule) -> dict[int, tuple[float, float]]:
    """Bucket index → (lower, upper): mean ± k·σ of the preceding buckets' ≥ window points.

    Prefix sums make each bucket a bisect, so a 5,000-bucket view costs milliseconds.
    """
    counts, totals, squares = [0], [0.0], [0.0]
    for bucket in buckets:
        counts.append(counts[-1] + bucket.count)
        totals.append(totals[-1] + bucket.total)
        squares.append(squares[-1] + bucket.squares)
    band: dict[int, tuple[float, float]] = {}
    for i, bucket in enumerate(buckets):
        # Largest j with counts[i] - counts[j] >= window: buckets j..i-1 form the baseline.
        j = bisect.bisect_right(counts, counts[i] - rule.window) - 1
        if j < 0:
            continue  # warm-up: fewer than `window` finite points before this bucket
        n = counts[i] - counts[j]
        mean = (totals[i] - totals[j]) / n
        variance = max((squares[i] - squares[j]) / n - mean * mean, 0.0)
        sigma = max(math.sqrt(variance), rule.sigma_floor_rel * abs(mean), rule.sigma_floor_abs)
        band[bucket.index] = (mean - rule.k * sigma, mean + rule.k * sigma)
    return band


def plan(low: int, high: int, max_points: int) -> int:
    """Bucket width in steps so that a series has at most ``max_points`` min/max points."""
    buckets = max(1, max_points // 2)
    return max(1, math.ceil((high - low + 1) / buckets))


def series(
    job: Job,
    name: str,
    *,
    from_step: int | None = None,
    to_step: int | None = None,
    max_points: int = 2000,
    rule: BandRule | None = None,
) -> dict[str, Any]:
    """One metric of a job between two steps (inclusive), downsampled; see the module doc."""
    bounds = step_range(job.pk, name)
    empty = {"name": name, "bucket_steps": 1, "steps": [], "times": [], "values": []}
    if bounds is None:
        return {**empty, "band": None}
    low = bounds[0] if from_step is None else max(from_step, bounds[0])
    high = bounds[1] if to_step is None else min(to_step, bounds[1])
    if low > high:
        return {**empty, "band": None}
    width = plan(low, high, max_points)
    # With a band, the buckets before `low` that hold its first baseline are read too.
    lookback = 0 if rule is None else math.ceil(rule.window / width) + 1
    origin = low - lookback * width
    buckets = fetch_buckets(job.pk, name, origin=origin, width=width, low=origin, high=high)
    bands = band_for(buckets, rule) if rule is not None else {}
    shown = [b for b in buckets if b.index >= lookback]
    steps, times, values, lower, upper = [], [], [], [], []
    for bucket in shown:
        edge = bands.get(bucket.index)
        for step, epoch, value in bucket.points:
            steps.append(step)
            times.append(round(epoch, 3))
            values.append(encode(value) if isinstance(value, float) else value)
            finite = isinstance(value, float) and math.isfinite(value)
            lower.append(edge[0] if edge and finite else None)
            upper.append(edge[1] if edge and finite else None)
    band = None
    if rule is not None:
        band = {
            "rule": rule.key,
            "k": rule.k,
            "window": rule.window,
            "lower": lower,
            "upper": upper,
        }
    return {
        "name": name,
        "bucket_steps": width,
        "steps": steps,
        "times": times,
        "values": values,
        "band": band,
    }


# --- Markers: where alerts fired and commands took effect -----------------------------------

COMMAND_LABELS = {
    "lower_lr": "LR lowered",
    "pause_data": "data paused",
    "checkpoint_and_pause": "paused",
    "resume": "resumed",
    "terminate": "terminated",
    "isolate_node": "node isolated",
    "inject_fault": "drill fault",
}


def _step_at(job_id: int, when) -> int | None:
    """The job's step at a moment: its last loss point at or before it (index on time)."""
    point = (
        MetricPoint.objects.filter(job_id=job_id, name="loss", time__lte=when)
        .order_by("-time")
        .values_list("step", flat=True)
        .first()
    )
    return point


def markers(job: Job, limit: int = 200) -> dict[str, list[dict[str, Any]]]:
    """Alerts at the step that raised them; commands at the step they acted on."""
    alerts = list(Alert.objects.filter(job=job).order_by("-raised_at")[:limit])
    raised_at_step = dict(
        TimelineEntry.objects.filter(
            alert__in=[a.pk for a in alerts], kind=TimelineKind.ALERT_RAISED
        ).values_list("alert_id", "step")
    )
    alert_steps = {a.pk: raised_at_step.get(a.pk) or a.first_step for a in alerts}
    commands = list(Command.objects.filter(job=job).order_by("-pk")[:limit])
    command_marks = []
    for command in commands:
        step = command.result.get("step") if isinstance(command.result, dict) else None
        if not isinstance(step, int):
            mark = alert_steps.get(command.alert_id) if command.alert_id is not None else None
            step = mark or _step_at(job.pk, command.issued_at)
        label = COMMAND_LABELS.get(command.kind, command.kind)
        if command.kind == "lower_lr" and command.params.get("factor"):
            label = f"LR ×{command.params['factor']}"
        command_marks.append(
            {
                "id": command.pk,
                "kind": command.kind,
                "status": command.status,
                "step": step if step is not None else job.current_step,
                "label": label,
            }
        )
    return {
        "alerts": [
            {
                "id": a.pk,
                "severity": a.severity,
                "status": a.status,
                "step": alert_steps[a.pk],
                "metric": a.metric,
                "label": f"{a.severity} {a.rule_name}",
            }
            for a in reversed(alerts)
        ],
        "commands": list(reversed(command_marks)),
    }


# --- Which chart a metric belongs on ----------------------------------------------------------

GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # (key, title, glob patterns) — first match wins; one chart per group, shared units.
    ("loss", "Loss", ("loss", "*loss", "*loss*", "*_loss")),
    ("grad", "Gradient norm", ("grad_norm", "grad_norm*", "*grad_norm*", "grad.*")),
    ("lr", "Learning rate", ("lr", "learning_rate", "lr.*", "*.lr")),
    ("throughput", "Throughput", ("throughput", "throughput.*", "dataloader.*", "perf.*")),
    ("health", "Node health", ("node.*", "comm.*", "hardware.*", "gpu.*.xid")),
)


def metric_groups(names: list[str]) -> list[dict[str, Any]]:
    """Charts for a job's metrics: the known groups first, then gpu.<i>.<what> by <what>."""
    groups: dict[str, dict[str, Any]] = {}
    for name in names:
        key, title = _group_of(name)
        groups.setdefault(key, {"key": key, "title": title, "names": []})["names"].append(name)
    order = [g[0] for g in GROUPS]
    return sorted(
        groups.values(),
        key=lambda g: (order.index(g["key"]) if g["key"] in order else len(order), g["key"]),
    )


def _group_of(name: str) -> tuple[str, str]:
    for key, title, patterns in GROUPS:
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return key, title
    parts = name.split(".")
    if len(parts) == 3 and parts[0] in ("gpu", "accelerator"):
        return f"gpu-{parts[2]}", f"GPU {parts[2]}"
    return f"metric-{name}", name


# --- Reads for the pages: the dashboard's sparklines, the review's curve, the job list --------

_RECENT_SQL = f"""
SELECT j.id, p.step, p.value FROM unnest(%s::bigint[]) AS j(id)
CROSS JOIN LATERAL (
  SELECT step, value FROM {TABLE}
  WHERE job_id = j.id AND name = %s ORDER BY step DESC LIMIT %s
) AS p
"""


def recent_points(job_ids: list[int], name: str, count: int) -> dict[int, list[tuple[int, float]]]:
    """The last ``count`` points of metric ``name`` of each job, oldest first (one indexed
    probe per job on PostgreSQL)."""
    found: dict[int, list[tuple[int, float]]] = {job_id: [] for job_id in job_ids}
    if not job_ids:
        return found
    rows: list[tuple[int, int, float]]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_RECENT_SQL, [job_ids, name, count])
            rows = cursor.fetchall()
    else:
        rows = [
            (job_id, step, value)
            for job_id in job_ids
            for step, value in MetricPoint.objects.filter(job_id=job_id, name=name)
            .order_by("-step")
            .values_list("step", "value")[:count]
        ]
    for job_id, step, value in rows:
        found[job_id].append((step, value))
    return {job_id: sorted(points) for job_id, points in found.items()}


def points_between(
    job_id: int, name: str, low: int, high: int, limit: int
) -> list[tuple[int, float]]:
    """Raw (step, value) points of one metric in a step range, at most ``limit`` rows."""
    rows = MetricPoint.objects.filter(
        job_id=job_id, name=name, step__gte=low, step__lte=high
    ).values_list("step", "value")[:limit]
    return list(rows)


def latest_value(name: str) -> Subquery:
    """A subquery for the newest value of metric ``name`` of the outer query's job."""
    newest = (
        MetricPoint.objects.filter(job=OuterRef("pk"), name=name)
        .order_by("-step", "-id")
        .values("value")[:1]
    )
    return Subquery(newest)
