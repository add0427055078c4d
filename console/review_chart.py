"""The metric curve of an incident's episode as inline SVG geometry (pure, no Django).

Server-rendered SVG rather than a canvas chart: the review page must print, and a printed
post-mortem keeps its curve. Non-finite values (the NaN that opened the incident) cannot be
plotted, so they are drawn as marks on the top edge; the chain's events are vertical lines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MAX_POINTS = 600  # more than the pixels across: the rest would be drawn over each other


@dataclass(frozen=True)
class Marker:
    x: float
    step: int
    label: str
    kind: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    # "x,y x,y …" runs of finite values; a non-finite value breaks the line, so the gap shows
    segments: tuple[str, ...]
    nonfinite: tuple[float, ...]  # x of each step whose value is NaN or infinite
    markers: tuple[Marker, ...]
    step_min: int
    step_max: int
    value_min: float | None
    value_max: float | None
    top: float
    bottom: float
    metric: str = ""


def downsample(points: Sequence[tuple[int, float]], limit: int = MAX_POINTS) -> list:
    """Every n-th point so that at most ``limit`` remain, keeping every non-finite one (the
    NaN is the point of the chart) and the last."""
    if len(points) <= limit:
        return list(points)
    stride = math.ceil(len(points) / limit)
    return [
        point
        for index, point in enumerate(points)
        if index % stride == 0 or not math.isfinite(point[1]) or index == len(points) - 1
    ]


def chart(
    points: Sequence[tuple[int, float]],
    events: Sequence[tuple[int, str, str]],
    *,
    width: int = 560,
    height: int = 240,
    pad: int = 28,
    metric: str = "",
) -> Chart | None:
    """The curve of ``points`` (step, value) with ``events`` (step, label, kind) as markers;
    None when there is nothing to draw."""
    points = downsample(sorted(points))
    steps = [step for step, _ in points] + [step for step, _, _ in events]
    if not steps:
        return None
    step_min, step_max = min(steps), max(steps)
    finite = [value for _, value in points if math.isfinite(value)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if high == low:
        low, high = low - 0.5, high + 0.5
    top, bottom = float(pad / 2), float(height - pad)

    def x(step: int) -> float:
        span = step_max - step_min or 1
        return round(pad + (width - 2 * pad) * (step - step_min) / span, 1)

    def y(value: float) -> float:
        return round(bottom - (bottom - top) * (value - low) / (high - low), 1)

    return Chart(
        width=width,
        height=height,
        segments=_segments([(x(step), y(v) if math.isfinite(v) else None) for step, v in points]),
        nonfinite=tuple(x(step) for step, value in points if not math.isfinite(value)),
        markers=tuple(Marker(x(step), step, label, kind) for step, label, kind in events),
        step_min=step_min,
        step_max=step_max,
        value_min=low if finite else None,
        value_max=high if finite else None,
        top=top,
        bottom=bottom,
        metric=metric,
    )


def _segments(coordinates: Sequence[tuple[float, float | None]]) -> tuple[str, ...]:
    """Runs of plotted points; a point without a y (non-finite) ends a run."""
    segments, run = [], []
    for x, y in coordinates:
        if y is not None:
            run.append(f"{x},{y}")
        elif run:
            segments.append(" ".join(run))
            run = []
    if run:
        segments.append(" ".join(run))
    return tuple(segments)
