"""Metric history for charts: downsampled in SQL, with the loss rule's band and markers.

A run streams up to millions of points per metric; a chart is ~1,000 pixels wide. Each series
is cut into at most ``max_points / 2`` buckets of whole steps and each bucket keeps its finite
minimum and maximum *at the steps where they occurred* (min/max downsampling: every spike and
dip survives, which averaging or LTTB's area heuristic may hide). Non-finite values are never
downsampled away: each bucket also keeps its first NaN, +Inf and -Inf as their own points, so a
NaN at step 4,512 of a million is still drawn. PostgreSQL does the bucketing in one grouped
scan (``breakers.storage.buckets``) of the raw points or of their 10 s / 1 min rollups
(``breakers.storage.reading`` picks). Points carry the rank that measured them: a chart shows
one rank's line (rank 0 by default), more ranks on request, and the min/max across ranks.

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

from django.db import connection
from django.db.models import F, FloatField, Func, OuterRef, Subquery, Value

from breakers.detection.engine import RuleSpec
from breakers.detection.rules import effective_rules
from breakers.models import Command, CompactionCursor, MetricBlock, MetricPoint
from breakers.storage import reading
from breakers.storage.buckets import Bucket
from core.nonfinite import encode
from incidents.models import Alert, Job, TimelineEntry, TimelineKind

TABLE = MetricPoint._meta.db_table
BLOCKS = MetricBlock._meta.db_table
COMPACTION = CompactionCursor._meta.db_table
MAX_POINTS_LIMIT = 10_000
MAX_NAMES = 200
MAX_RANKS = 16  # per-rank series one request may ask for

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


@dataclass(frozen=True)
class BandRule:
    """The parameters of the rule whose band is drawn (a ``deviation`` rule on the metric)."""

    key: str
    k: float
    window: int
    sigma_floor_rel: float
    sigma_floor_abs: float


def metric_names(job_id: int) -> list[str]:
    """Distinct metric names of a job: a loose index scan of the raw rows (a console upgraded
    from row storage), one index probe per name, and the names recorded on its compaction
    cursor (by ingest when a batch brings a new one, and by compaction)."""
    if connection.vendor != "postgresql":
        names = MetricPoint.objects.filter(job_id=job_id).values_list("name", flat=True)
        return sorted(set(names))[:MAX_NAMES]
    with connection.cursor() as cursor:
        cursor.execute(_NAMES_SQL, {"job": job_id})
        raw = {row[0] for row in cursor.fetchall()}
    compacted = CompactionCursor.objects.filter(job_id=job_id).values_list("names", flat=True)
    return sorted(raw.union(*compacted))[:MAX_NAMES]


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


def _drawn(bucket: Bucket, edge: tuple[float, float] | None) -> list[tuple]:
    """(step, time, value as JSON, band lower, band upper) of each drawn point of a bucket."""
    rows = []
    for step, epoch, value in bucket.points:
        finite = isinstance(value, float) and math.isfinite(value)
        shown = encode(value) if isinstance(value, float) else value
        lower, upper = edge if edge is not None and finite else (None, None)
        rows.append((step, round(epoch, 3), shown, lower, upper))
    return rows


def _line(buckets: list[Bucket], bands: dict[int, tuple[float, float]]) -> dict[str, list]:
    # Step order for the chart: rollup rows of two attempts (a resume went back in steps)
    # overlap, and a row's extreme may sit past its grid bucket.
    rows = sorted((r for b in buckets for r in _drawn(b, bands.get(b.index))), key=lambda r: r[0])
    return {
        "steps": [r[0] for r in rows],
        "times": [r[1] for r in rows],
        "values": [r[2] for r in rows],
        "lower": [r[3] for r in rows],
        "upper": [r[4] for r in rows],
    }


def _spread(buckets: list[Bucket], origin: int, width: int) -> dict[str, list]:
    """Across every rank, per bucket: the finite min and max (the band drawn around rank 0's
    line) and the first NaN/±Inf of any rank, so a non-finite value on rank 37 is drawn too."""
    out: dict[str, list] = {
        "steps": [],
        "low": [],
        "high": [],
        "marker_steps": [],
        "marker_values": [],
    }
    for bucket in buckets:
        extremes = bucket.finite_range()
        if extremes is not None:
            out["steps"].append(origin + bucket.index * width)
            out["low"].append(encode(extremes[0]))
            out["high"].append(encode(extremes[1]))
        for step, _, value in bucket.points:
            if isinstance(value, str):
                out["marker_steps"].append(step)
                out["marker_values"].append(value)
    return out


def _empty_series(name: str, rank: int) -> dict[str, Any]:
    return {
        "name": name,
        "rank": rank,
        "bucket_steps": 1,
        "steps": [],
        "times": [],
        "values": [],
        "band": None,
        "source": "raw",
        "spread": None,
        "ranks": {},
    }


def _other_lines(
    job_id: int, name: str, source: Any, ranks: list[int], grid: dict[str, Any]
) -> dict[str, dict[str, list[Any]]]:
    """More ranks' lines on the same buckets (no band), by rank."""
    others = {}
    for other in ranks:
        found = _line(reading.read(job_id, name, source, rank=other, **grid), {})
        others[str(other)] = {key: found[key] for key in ("steps", "times", "values")}
    return others


def _stored_range(
    raw: tuple[int, int] | None,
    rolled: tuple[int, int] | None,
    from_step: int | None,
    to_step: int | None,
) -> tuple[int, int] | None:
    """The steps asked for that raw points or rollups hold (None: none of them)."""
    known = [b for b in (raw, rolled) if b is not None]
    if not known:
        return None
    first, last = min(b[0] for b in known), max(b[1] for b in known)
    low = first if from_step is None else max(from_step, first)
    high = last if to_step is None else min(to_step, last)
    return None if low > high else (low, high)


def _band(rule: BandRule | None, lower: list[Any], upper: list[Any]) -> dict[str, Any] | None:
    """The expected band around the line, as the rule that draws it sees it."""
    if rule is None:
        return None
    return {"rule": rule.key, "k": rule.k, "window": rule.window, "lower": lower, "upper": upper}


def _buckets(low: int, high: int, max_points: int, rule: BandRule | None) -> tuple[int, int, int]:
    """The buckets' width, how many are read before ``low``, and the first one's step."""
    width = plan(low, high, max_points)
    # With a band, the buckets before `low` that hold its first baseline are read too.
    lookback = 0 if rule is None else math.ceil(rule.window / width) + 1
    return width, lookback, low - lookback * width


def _rank_line(
    job: Job,
    name: str,
    source: reading.Source,
    rule: BandRule | None,
    rank: int,
    lookback: int,
    grid: dict[str, int],
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``rank``'s line from ``low`` on, and its band (baselines from the buckets before)."""
    buckets = reading.read(job.pk, name, source, rank=rank, **grid)
    bands = band_for(buckets, rule) if rule is not None else {}
    line = _line([b for b in buckets if b.index >= lookback], bands)
    band = _band(rule, line.pop("lower"), line.pop("upper"))
    return line, band


def series(
    job: Job,
    name: str,
    *,
    from_step: int | None = None,
    to_step: int | None = None,
    max_points: int = 2000,
    rule: BandRule | None = None,
    rank: int = 0,
    ranks: tuple[int, ...] = (),
    spread: bool = False,
) -> dict[str, Any]:
    """One metric of a job between two steps (inclusive), downsampled; see the module doc.

    ``rank``'s line (with the band); ``ranks``: more ranks' lines; ``spread``: the min/max
    across every rank per bucket. Raw points or rollups, whichever holds the range
    (``breakers.storage.reading``)."""
    raw = reading.raw_range(job.pk, name)
    rolled = reading.rollup_range(job.pk, name)
    empty = _empty_series(name, rank)
    stored = _stored_range(raw, rolled, from_step, to_step)
    if stored is None:
        return empty
    low, high = stored
    width, lookback, origin = _buckets(low, high, max_points, rule)
    grid = {"origin": origin, "width": width, "low": origin, "high": high}
    source = reading.choose(job.pk, name, raw, rolled, low=low, high=high, width=width, rank=rank)
    line, band = _rank_line(job, name, source, rule, rank, lookback, grid)
    grid = {**grid, "low": low}
    others = _other_lines(job.pk, name, source, [r for r in ranks if r != rank], grid)
    everyone = reading.read_spread(job.pk, name, source, **grid) if spread else None
    return {
        **empty,
        "bucket_steps": width,
        **line,
        "band": band,
        "source": source.label,
        "spread": None if everyone is None else _spread(everyone, origin, width),
        "ranks": others,
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


# The newest loss point at or before a moment, raw or in the newest blocks begun before it (a
# block per rank: the newest 64 cover 64 ranks; beyond, a near step is as good for a marker).
_STEP_AT_SQL = f"""
SELECT step FROM (
  (SELECT step, time FROM {TABLE} WHERE job_id = %(job)s AND name = 'loss' AND time <= %(when)s
   ORDER BY time DESC, step DESC LIMIT 1)
  UNION ALL
  (SELECT p.step, p.time FROM (SELECT min(first_step) AS low, max(last_step) AS high
     FROM (SELECT first_step, last_step FROM {BLOCKS}
           WHERE job_id = %(job)s AND first_time <= %(when)s AND names @> ARRAY['loss'::varchar]
           ORDER BY first_time DESC LIMIT 64) AS newest_blocks) AS b
   CROSS JOIN LATERAL brakeline_points(%(job)s, 'loss', b.low, b.high) AS p
   WHERE p.time <= %(when)s ORDER BY p.time DESC, p.step DESC LIMIT 1)
) AS found ORDER BY time DESC, step DESC LIMIT 1
"""


def _step_at(job_id: int, when) -> int | None:
    """The job's step at a moment: its last loss point at or before it (index on time); of
    points stamped alike (a batch sent without times takes its time of receipt), the highest
    step."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_STEP_AT_SQL, {"job": job_id, "when": when})
            row = cursor.fetchone()
        return None if row is None else int(row[0])
    return (
        MetricPoint.objects.filter(job_id=job_id, name="loss", time__lte=when)
        .order_by("-time", "-step")
        .values_list("step", flat=True)
        .first()
    )


def _command_mark(job: Job, command: Command, alert_steps: dict[int, Any]) -> dict[str, Any]:
    """A command at the step it acted on: the one it reports, else its alert's, else the
    job's step when it was issued."""
    step = command.result.get("step") if isinstance(command.result, dict) else None
    if not isinstance(step, int):
        mark = alert_steps.get(command.alert_id) if command.alert_id is not None else None
        step = mark or _step_at(job.pk, command.issued_at)
    label = COMMAND_LABELS.get(command.kind, command.kind)
    if command.kind == "lower_lr" and command.params.get("factor"):
        label = f"LR ×{command.params['factor']}"
    return {
        "id": command.pk,
        "kind": command.kind,
        "status": command.status,
        "step": step if step is not None else job.current_step,
        "label": label,
    }


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
    command_marks = [_command_mark(job, command, alert_steps) for command in commands]
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

# Rank 0's last points per job: one read of the series' step range that holds them, from the
# lesser of its newest raw rows' steps and its newest blocks' first steps (ingest writes a block
# per batch and rank, so the newest ``count`` blocks holding the series hold ≥ count points).
_RECENT_SQL = f"""
SELECT j.id, p.step, p.value FROM unnest(%(jobs)s::bigint[]) AS j(id)
CROSS JOIN LATERAL (
  SELECT least(
    (SELECT min(step) FROM (SELECT step FROM {TABLE}
     WHERE job_id = j.id AND name = %(name)s AND rank = 0 ORDER BY step DESC LIMIT %(count)s)
     AS newest_rows),
    (SELECT min(first_step) FROM (SELECT first_step FROM {BLOCKS}
     WHERE job_id = j.id AND rank = 0 AND names @> ARRAY[%(name)s::varchar]
     ORDER BY first_step DESC LIMIT %(count)s) AS newest_blocks)) AS low
) AS r
CROSS JOIN LATERAL (
  SELECT u.step, u.value FROM brakeline_points(j.id, %(name)s, r.low, 9223372036854775807) AS u
  WHERE r.low IS NOT NULL AND u.rank = 0 ORDER BY u.step DESC LIMIT %(count)s
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
            cursor.execute(_RECENT_SQL, {"jobs": job_ids, "name": name, "count": count})
            rows = cursor.fetchall()
    else:
        rows = [
            (job_id, step, value)
            for job_id in job_ids
            for step, value in MetricPoint.objects.filter(job_id=job_id, name=name, rank=0)
            .order_by("-step")
            .values_list("step", "value")[:count]
        ]
    for job_id, step, value in rows:
        found[job_id].append((step, value))
    return {job_id: sorted(points) for job_id, points in found.items()}


def points_between(
    job_id: int, name: str, low: int, high: int, limit: int
) -> list[tuple[int, float]]:
    """Raw (step, value) points of one metric of rank 0 in a step range, at most ``limit``."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT step, value FROM brakeline_points(%s, %s, %s, %s) WHERE rank = 0 "
                "ORDER BY step LIMIT %s",
                [job_id, name, low, high, limit],
            )
            return cursor.fetchall()
    rows = MetricPoint.objects.filter(
        job_id=job_id, name=name, rank=0, step__gte=low, step__lte=high
    ).values_list("step", "value")[:limit]
    return list(rows)


def latest_value(name: str) -> Func | Subquery:
    """The newest value of metric ``name`` of rank 0 of the outer query's job (an annotation):
    one rank's, as the sparkline's, so a thousand ranks' last batches are not all read."""
    if connection.vendor == "postgresql":
        # brakeline_latest_value (migrations breakers 0022, 0026): raw rows, else blocks.
        return Func(
            F("pk"), Value(name), function="brakeline_latest_value", output_field=FloatField()
        )
    newest = (
        MetricPoint.objects.filter(job=OuterRef("pk"), name=name, rank=0)
        .order_by("-step", "-time")
        .values("value")[:1]
    )
    return Subquery(newest)
