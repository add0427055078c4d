"""The breaker engine — pure Python, no Django.

Rules are data (`RuleSpec`). A `JobEvaluator` holds, for one job, the detector state of every
(rule, metric, node, rank) series, turns detector verdicts into edge-triggered `Finding`s and
serialises all of it to a JSON-able dict. Each rank of a multi-rank job is a series of its own:
two ranks' losses are two curves, and interleaving them into one would make every rolling,
spike or rising detector compare rank 0's value with rank 1's.

How a caller (the Django worker) drives it, per job and strictly one job evaluation at a time:
    evaluator = JobEvaluator.from_state(rules, stored_state)   # or JobEvaluator(rules)
    for point in batch:                      # in step order, each point once
        findings += evaluator.feed(point)
    findings += evaluator.tick(now)          # periodically too, even with no points
    stored_state = evaluator.to_state()      # persist with the job (JSON)
A "fire" finding asks for its `action`; a "clear" finding closes the episode and asks for
nothing. While an episode is open further anomalous points emit nothing (no spam).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Any

from breakers.detection.detectors import (
    ANOMALOUS,
    HEALTHY,
    PENDING,
    Detector,
    Verdict,
    format_duration,
    format_number,
    make_config,
)
from breakers.detection.detectors import DETECTORS as DETECTOR_KINDS
from breakers.recovery.verdict import (
    DEFAULT_BUDGET,
    HOLD_POLICY,
    MAX_BUDGET,
    POLICIES,
    RECOVER_POLICY,
)
from core.nonfinite import decode

LAYERS = ("health", "stability", "performance")
SEVERITIES = ("L1", "L2", "L3", "L4")
ACTIONS = (
    "none",
    "lower_lr",
    "pause_data",
    "checkpoint_and_pause",
    "terminate_and_isolate",
    "record",
)
# 2: series keys carry the rank. A version-1 state (no ranks) is read as rank 0's series.
# 3: rolling windows as packed doubles (breakers.detection.rolling.pack_floats); 1 and 2 kept
# them as lists of numbers, which are still read.
STATE_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)

# (rule key, metric name or "*" when pooled, node or None when pooled, rank or None when pooled)
SeriesKey = tuple[str, str, str | None, int | None]

__all__ = [
    "ACTIONS",
    "DETECTOR_KINDS",
    "Finding",
    "JobEvaluator",
    "LAYERS",
    "Point",
    "RuleSpec",
    "SEVERITIES",
    "parse_value",
]


def parse_value(raw: Any) -> float:
    """A metric value as the agent protocol allows it: a JSON number, or "NaN", "Infinity",
    "-Infinity". Booleans and other strings are refused (ValueError)."""
    return decode(raw)


def encode_number(value: float | None) -> float | str | None:
    """Strict-JSON form of a float: non-finite values become the protocol's strings."""
    if value is None or math.isfinite(value):
        return value
    return format_number(value)


@dataclass(slots=True)
class Point:
    """One metric sample. `time` is float epoch seconds, on the same clock as tick(now);
    `rank` the process (torch.distributed rank) that measured it, 0 for a single process."""

    name: str
    step: int
    time: float
    value: float
    node: str | None = None
    rank: int = 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], default_time: float) -> Point:
        """From an agent-protocol point; `time` may be epoch seconds or ISO 8601 ("…Z")."""
        raw_time = data.get("time")
        if raw_time is None:
            time = float(default_time)
        elif isinstance(raw_time, str):
            time = datetime.fromisoformat(raw_time).timestamp()
        else:
            time = float(raw_time)
        return cls(
            str(data["name"]),
            int(data["step"]),
            time,
            parse_value(data["value"]),
            data.get("node"),
            int(data.get("rank") or 0),
        )


@dataclass(frozen=True)
class RuleSpec:
    """A breaker rule as data.

    `metric` is a selector: an exact name or an fnmatch glob (`gpu.*.temp`), several joined
    with "|" (`loss|grad_norm`); matching is case-sensitive. `detector` names a kind of
    `breakers.detection.detectors.DETECTORS`, configured by `params`. Detector state is kept per
    (rule, metric name, node, rank): `per_metric=False` pools every matching metric of every
    rank into one series (node-failure counts: a node reported down by rank 3 and another by
    rank 5 are two failing nodes), `per_node=False` pools the nodes. An open episode clears after
    `clear_after` consecutive healthy observations spanning at least `clear_after_seconds`
    (hysteresis, so a flapping metric does not page ten times). Performance-layer rules only
    record: their action is always "record". A `shadow` rule's findings are the same; what the
    caller does with them differs (it records them, it never acts on them).
    """

    key: str
    name: str
    layer: str
    metric: str
    detector: str
    params: dict[str, Any] = field(default_factory=dict)
    severity: str = "L1"
    action: str = "none"
    action_params: dict[str, Any] = field(default_factory=dict)
    per_node: bool = False
    per_metric: bool = True
    enabled: bool = True
    clear_after: int = 1
    clear_after_seconds: float = 0.0
    runbook: str = ""  # runbook entry the console shows as the suggested next step
    # After its automatic L3 brake: hold for a person, or recover automatically within
    # ``recovery_budget`` recoveries per job per hour (breakers.recovery, docs/recovery.md).
    recovery: str = HOLD_POLICY
    recovery_budget: int = DEFAULT_BUDGET
    # Observe only: the rule is evaluated like any other, but what it finds is recorded as
    # "would have fired" (breakers.detection.shadow) instead of raising an alert or acting.
    shadow: bool = False
    config: Any = field(init=False, repr=False, compare=False)
    patterns: tuple[str, ...] = field(init=False, repr=False, compare=False)
    fingerprint: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_enumerations()
        self._check_recovery()
        if not isinstance(self.clear_after, int) or self.clear_after < 1:
            raise ValueError(f"{self.key}: clear_after must be an integer >= 1")
        if not self.clear_after_seconds >= 0:
            raise ValueError(f"{self.key}: clear_after_seconds must be >= 0")
        patterns = tuple(p.strip() for p in self.metric.split("|") if p.strip())
        if not patterns:
            raise ValueError(f"{self.key}: metric selector is empty")
        if self.layer == "performance":
            if self.action not in ("none", "record"):
                raise ValueError(f"{self.key}: performance-layer rules only record")
            object.__setattr__(self, "action", "record")
        try:
            config = make_config(self.detector, self.params)
        except ValueError as error:
            raise ValueError(f"rule {self.key}: {error}") from None
        object.__setattr__(self, "params", dict(self.params))
        object.__setattr__(self, "action_params", dict(self.action_params))
        object.__setattr__(self, "config", config)
        object.__setattr__(self, "patterns", patterns)
        # Identifies the detector configuration: stored state is reused only when equal.
        canonical = json.dumps([self.detector, self.params], sort_keys=True, default=str)
        object.__setattr__(self, "fingerprint", hashlib.sha256(canonical.encode()).hexdigest()[:16])

    def _check_recovery(self) -> None:
        if self.recovery not in POLICIES:
            raise ValueError(f"{self.key}: recovery must be one of {', '.join(POLICIES)}")
        budget = self.recovery_budget
        if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= MAX_BUDGET:
            raise ValueError(
                f"{self.key}: recovery_budget must be a whole number 1 to {MAX_BUDGET}"
            )
        if self.recovery == RECOVER_POLICY and (
            self.severity != "L3" or self.action != "checkpoint_and_pause"
        ):
            raise ValueError(
                f"{self.key}: recovery recover is only for an L3 rule whose action is "
                "checkpoint_and_pause"
            )

    def _check_enumerations(self) -> None:
        if not self.key or not isinstance(self.key, str):
            raise ValueError("a rule needs a non-empty string key")
        for name, allowed in (("layer", LAYERS), ("severity", SEVERITIES), ("action", ACTIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{self.key}: {name} must be one of {', '.join(allowed)}")

    def matches(self, metric_name: str) -> bool:
        return any(fnmatch.fnmatchcase(metric_name, pattern) for pattern in self.patterns)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able; `RuleSpec.from_dict(rule.to_dict()) == rule`."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        data["params"], data["action_params"] = dict(self.params), dict(self.action_params)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RuleSpec:
        known = {f.name for f in fields(cls) if f.init}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown rule fields: {', '.join(sorted(unknown))}")
        return cls(**data)


@dataclass(frozen=True)
class Finding:
    """An edge of an episode: kind "fire" (the condition started) or "clear" (it ended).

    `first_step`/`first_time` are the first anomalous point of the episode (for time to
    detect); `step`/`time` the point (or tick) that produced this finding. `value` is the
    judged value (seconds of silence, number of failing nodes for those detectors);
    `threshold` the crossed boundary as a number, None where there is none (non-finite).
    `duration_seconds`/`duration_steps` measure first anomalous point → this finding.
    `rank` is the rank of the series (None for a rule pooling its metrics, hence its ranks);
    once the job has shown more than one rank the description starts with "rank N: ".
    """

    kind: str
    rule_key: str
    rule_name: str
    layer: str
    severity: str
    action: str
    action_params: dict[str, Any]
    metric: str
    node: str | None
    nodes: tuple[str, ...]
    step: int
    time: float
    first_step: int
    first_time: float
    value: float
    threshold: float | None
    description: str
    duration_seconds: float
    duration_steps: int
    runbook: str = ""
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Strict-JSON dict (non-finite numbers as "NaN" / "Infinity" / "-Infinity")."""
        data = asdict(self)
        data["nodes"] = list(self.nodes)
        data["value"] = encode_number(self.value)
        data["threshold"] = encode_number(self.threshold)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        values = dict(data)
        values["nodes"] = tuple(values.get("nodes", ()))
        values["value"] = parse_value(values["value"])
        if values.get("threshold") is not None:
            values["threshold"] = parse_value(values["threshold"])
        return cls(**values)


class _Episode:
    """Edge-trigger and hysteresis state of one series."""

    __slots__ = ("firing", "first_step", "first_time", "threshold", "healthy", "healthy_since")

    def __init__(self) -> None:
        self.firing = False
        self.first_step = 0
        self.first_time = 0.0
        self.threshold: float | None = None
        self.healthy = 0  # consecutive healthy observations while firing
        self.healthy_since = 0.0

    def to_state(self) -> list[Any]:
        return [
            self.firing,
            self.first_step,
            self.first_time,
            self.threshold,
            self.healthy,
            self.healthy_since,
        ]

    def load_state(self, state: list[Any]) -> None:
        (
            self.firing,
            self.first_step,
            self.first_time,
            self.threshold,
            self.healthy,
            self.healthy_since,
        ) = state


class _Series:
    __slots__ = ("rule", "key", "detector", "episode", "last")

    def __init__(self, rule: RuleSpec, key: SeriesKey) -> None:
        self.rule = rule
        self.key = key
        self.detector: Detector = DETECTOR_KINDS[rule.detector](rule.config)
        self.episode = _Episode()
        self.last: list[Any] = [key[1], 0, key[2]]  # name, step, node of the latest point


class JobEvaluator:
    """Evaluates one job's points against its rules; all state serialisable.

    Feed points in step order (each once); call `tick(now)` periodically so silence and
    node-failure windows are judged when no point arrives. Not thread-safe: evaluate one job
    in one place at a time (docs/architecture.md: evaluation of one job is serialised).
    """

    def __init__(self, rules: Iterable[RuleSpec]) -> None:
        self.rules: list[RuleSpec] = [rule for rule in rules if rule.enabled]
        self._rules_by_key: dict[str, RuleSpec] = {}
        for rule in self.rules:
            if rule.key in self._rules_by_key:
                raise ValueError(f"duplicate rule key {rule.key!r}")
            self._rules_by_key[rule.key] = rule
        self._series: dict[SeriesKey, _Series] = {}
        self._timed: dict[SeriesKey, _Series] = {}
        # Whether any point came from a rank other than 0: only then do descriptions name the
        # rank (a single-process job's alerts read as they always did).
        self.multi_rank = False
        self._matches: dict[str, tuple[RuleSpec, ...]] = {}
        # Episodes that were open in a restored state but whose rule is gone or now keys its
        # series differently: the caller should close the corresponding alerts.
        self.orphaned: list[dict[str, Any]] = []

    def feed(self, point: Point) -> list[Finding]:
        """Evaluate one point against every enabled rule whose selector matches its name."""
        rules = self._rules_for(point.name)
        if point.rank and not self.multi_rank:
            self.multi_rank = True
        findings: list[Finding] = []
        for rule in rules:
            key = (
                rule.key,
                point.name if rule.per_metric else "*",
                point.node if rule.per_node else None,
                point.rank if rule.per_metric else None,
            )
            series = self._series.get(key) or self._add_series(rule, key)
            verdict = series.detector.observe(point)
            if series.detector.time_based:
                series.last = [point.name, point.step, point.node]
            if verdict.state != ANOMALOUS and not series.episode.firing:
                continue  # the hot path: nothing open, nothing new
            finding = self._advance(series, verdict, point)
            if finding is not None:
                findings.append(finding)
        return findings

    def _rules_for(self, name: str) -> tuple[RuleSpec, ...]:
        """The enabled rules whose selector matches a metric name, in rule order."""
        rules = self._matches.get(name)
        if rules is None:
            rules = self._matches[name] = tuple(rule for rule in self.rules if rule.matches(name))
        return rules

    def feed_many(self, points: Iterable[Point]) -> list[Finding]:
        findings: list[Finding] = []
        for point in points:
            findings.extend(self.feed(point))
        return findings

    def tick(self, now: float) -> list[Finding]:
        """Judge the time-based series (silence, node failures) at `now` (epoch seconds)."""
        findings: list[Finding] = []
        for series in self._timed.values():
            verdict = series.detector.tick(now)
            if verdict.state != ANOMALOUS and not series.episode.firing:
                continue
            name, step, node = series.last
            value = verdict.observed if verdict.observed is not None else math.nan
            rank = series.key[3] or 0
            finding = self._advance(series, verdict, Point(name, step, now, value, node, rank))
            if finding is not None:
                findings.append(finding)
        return findings

    def open_episodes(self) -> list[dict[str, Any]]:
        """The conditions currently firing (rule key, metric, node, rank, first step and time)."""
        return [
            _episode_info(key, series.episode.to_state())
            for key, series in self._series.items()
            if series.episode.firing
        ]

    def rearm(self, rule_key: str, node: str | None) -> int:
        """Forget the open episodes of a rule (on a node), every rank's: the next anomalous
        point fires again. For an alert closed from outside the engine (re-armed when training
        resumed after its brake). Returns how many series were re-armed."""
        rearmed = 0
        for key, series in self._series.items():
            if key[0] == rule_key and (key[2] or "") == (node or "") and series.episode.firing:
                series.episode = _Episode()
                rearmed += 1
        return rearmed

    def _add_series(self, rule: RuleSpec, key: SeriesKey) -> _Series:
        series = self._series[key] = _Series(rule, key)
        if series.detector.time_based:
            self._timed[key] = series
        return series

    def _advance(
        self, series: _Series, verdict: Verdict, point: Point, described: str | None = None
    ) -> Finding | None:
        """Edge trigger + hysteresis: fire once, stay quiet while firing, clear once.
        `described`: the detector's description, when it was taken as the verdict was given
        (a batch judges its points before it walks their edges)."""
        episode = series.episode
        state = verdict.state
        if state in (ANOMALOUS, PENDING):
            episode.healthy = 0
            if state == PENDING or episode.firing:
                return None
            episode.firing = True
            episode.first_step = point.step if verdict.since_step is None else verdict.since_step
            episode.first_time = point.time if verdict.since_time is None else verdict.since_time
            episode.threshold = verdict.threshold
            return self._finding("fire", series, verdict, point, described)
        if state != HEALTHY:
            return None  # no opinion: neither extends nor clears the episode
        if episode.healthy == 0:
            episode.healthy_since = point.time
        episode.healthy += 1
        rule = series.rule
        if (
            episode.healthy < rule.clear_after
            or point.time - episode.healthy_since < rule.clear_after_seconds
        ):
            return None
        finding = self._finding("clear", series, verdict, point)
        series.episode = _Episode()
        return finding

    def _finding(
        self,
        kind: str,
        series: _Series,
        verdict: Verdict,
        point: Point,
        described: str | None = None,
    ) -> Finding:
        rule, episode = series.rule, series.episode
        value = verdict.observed if verdict.observed is not None else point.value
        duration = point.time - episode.first_time
        rank = series.key[3]
        who = f"rank {rank}: " if self.multi_rank and rank is not None else ""
        said, action, action_params = _said_and_asked(
            kind, series, verdict, point, value, duration, described
        )
        description = who + said
        return Finding(
            kind=kind,
            rule_key=rule.key,
            rule_name=rule.name,
            layer=rule.layer,
            severity=rule.severity,
            action=action,
            action_params=action_params,
            metric=point.name,
            node=point.node,
            nodes=verdict.nodes or ((point.node,) if point.node else ()),
            step=point.step,
            time=point.time,
            first_step=episode.first_step,
            first_time=episode.first_time,
            value=value,
            threshold=episode.threshold,
            description=description,
            duration_seconds=duration,
            duration_steps=point.step - episode.first_step,
            runbook=rule.runbook,
            rank=rank,
        )

    def to_state(self) -> dict[str, Any]:
        """All detector and episode state as a strict-JSON-able dict."""
        return {
            "version": STATE_VERSION,
            "series": [
                {
                    "rule": key[0],
                    "metric": key[1],
                    "node": key[2],
                    "rank": key[3],
                    "fingerprint": series.rule.fingerprint,
                    "detector": series.detector.to_state(),
                    "episode": series.episode.to_state(),
                    "last": list(series.last),
                }
                for key, series in self._series.items()
            ],
        }

    @classmethod
    def from_state(cls, rules: Iterable[RuleSpec], state: Mapping[str, Any]) -> JobEvaluator:
        """Resume from `to_state()` output. Series whose rule changed its detector
        configuration keep their open episode but restart their detector (warm-up); series
        whose rule is gone or disabled are dropped, and their open episodes listed in
        `orphaned`. A version-1 state (before ranks) resumes as rank 0's series: exactly what
        it was for a single-process job; a multi-rank job's pooled series is its best guess."""
        evaluator = cls(rules)
        version = state.get("version")
        if version not in READABLE_VERSIONS:
            raise ValueError(f"unsupported evaluator state version {version!r}")
        for entry in state["series"]:
            rule = evaluator._rules_by_key.get(entry["rule"])
            # Version 1 kept no ranks: its series become rank 0's (pooled ones stay pooled).
            pooled = entry["metric"] == "*"
            rank = entry["rank"] if version != 1 else (None if pooled else 0)
            key: SeriesKey = (entry["rule"], entry["metric"], entry["node"], rank)
            if rule is None or not _key_fits(rule, key):
                if entry["episode"][0]:
                    evaluator.orphaned.append(_episode_info(key, entry["episode"]))
                continue
            series = evaluator._add_series(rule, key)
            if entry["fingerprint"] == rule.fingerprint:
                series.detector.load_state(entry["detector"])
            series.episode.load_state(list(entry["episode"]))
            series.last = list(entry["last"])
            evaluator.multi_rank = evaluator.multi_rank or bool(rank)
        return evaluator


def _said_and_asked(
    kind: str,
    series: _Series,
    verdict: Verdict,
    point: Point,
    value: float,
    duration: float,
    described: str | None,
) -> tuple[str, str, dict[str, Any]]:
    """What a finding says and which action it asks for: a fire, the detector's words and
    the rule's action; a clear, how long the episode lasted, and no action."""
    rule, episode = series.rule, series.episode
    if kind == "fire":
        if described is None:
            described = series.detector.describe(point.name, value, verdict)
        return described, rule.action, dict(rule.action_params)
    said = (
        f"{point.name} back to normal ({rule.name}): healthy for {episode.healthy} "
        f"observation(s); the episode began at step {episode.first_step} and lasted "
        f"{format_duration(duration)}"
    )
    return said, "none", {}  # a clear never asks for an action


def _episode_info(key: SeriesKey, episode: list[Any]) -> dict[str, Any]:
    """An open episode as `open_episodes` and `orphaned` list it."""
    rule, metric, node, rank = key
    info = {"rule": rule, "metric": metric, "node": node, "rank": rank}
    return info | {"first_step": episode[1], "first_time": episode[2]}


def _key_fits(rule: RuleSpec, key: SeriesKey) -> bool:
    """Whether a stored series key has the shape the rule would give it now."""
    pooled_metric = key[1] == "*"
    return (
        pooled_metric != rule.per_metric
        and (key[2] is None or rule.per_node)
        and (key[3] is None) == pooled_metric
    )
