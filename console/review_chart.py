"""The metric curve of an incident's episode as inline SVG geometry (pure, no Django).

Server-rendered SVG rather than a canvas chart: the review page must print, and a printed
post-mortem keeps its curve. The rules are the job page's (console/static/console/
chart-math.js), so both charts read alike: the y axis is scaled to the healthy values (the
anomaly's run-up and episode left out, robust percentiles of the rest) and a value beyond is
drawn on the plot's edge with a mark, ticks read "0.25", "1.5k", "3.5e33" (never 37 digits),
non-finite values are marks on the top edge, the chain's events are vertical lines whose
labels are put in rows so that none covers another.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

MAX_POINTS = 600  # more than the pixels across: the rest would be drawn over each other
CHAR_PX = 6.2  # the width of one character of the 10 px labels, generously
LABEL_ROW_PX = 13
MAX_LABEL_ROWS = 4
# Beyond the percentiles by more than FENCE times their spread is an outlier: a learning rate's
# warm-up or a loss spike of a few times its noise stay in view, 1e33 does not.
FENCE = 10
MIN_HEALTHY = 10  # points; fewer kept, and the view is every finite value
SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


@dataclass(frozen=True)
class Marker:
    x: float
    step: int
    label: str
    kind: str
    label_x: float = 0.0
    label_y: float = 0.0
    label_width: float = 0.0
    shown: bool = True  # False: more labels than rows; the line stays, the legend lists it


@dataclass(frozen=True)
class Tick:
    at: float  # pixel position along its axis
    text: str


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
    value_min: float | None  # the view's range (the healthy values)
    value_max: float | None
    top: float
    bottom: float
    metric: str = ""
    left: float = 28.0
    right: float = 532.0
    y_ticks: tuple[Tick, ...] = ()
    x_ticks: tuple[Tick, ...] = ()
    clipped_above: tuple[float, ...] = ()  # x of each point drawn on the top edge
    clipped_below: tuple[float, ...] = ()
    clipped_max: float | None = None
    clipped_min: float | None = None
    phone: Chart | None = None  # the same curve drawn for a narrow screen (CSS picks one)

    @property
    def clip_note(self) -> str:
        parts = []
        if self.clipped_above:
            parts.append(
                f"▲ {len(self.clipped_above)} above the view, up to "
                f"{format_number(self.clipped_max)}"
            )
        if self.clipped_below:
            parts.append(
                f"▼ {len(self.clipped_below)} below, down to {format_number(self.clipped_min)}"
            )
        return " · ".join(parts)


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


# --- Numbers for people -----------------------------------------------------------------------


def _decimals(step: float) -> int:
    scaled = abs(step)
    for digits in range(8):
        if abs(round(scaled) - scaled) < 1e-6 * scaled:
            return digits
        scaled *= 10
    return 8


def _trim(text: str) -> str:
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_number(value: float | None, step: float | None = None) -> str:
    """SI prefixes from a thousand to a trillion, exponent notation beyond and below a
    thousandth; with ``step`` (the tick increment), as many decimals as it has."""
    if value is None or not math.isfinite(value):
        return "—" if value is None else ("NaN" if math.isnan(value) else "Inf")
    if value == 0:
        return "0"
    size = abs(value)
    if size >= 1e15 or size < 1e-3:
        exponent = math.floor(math.log10(size) + 1e-9)
        digits = min(5, _decimals(step / 10**exponent)) if step else 2
        mantissa, power = f"{value:.{digits}e}".split("e")
        return f"{_trim(mantissa)}e{int(power)}"
    for factor, prefix in SI:
        if size >= factor:
            digits = _decimals(step / factor) if step else 3
            return _trim(f"{value / factor:.{digits}f}") + prefix
    digits = _decimals(step) if step else max(0, 3 - math.floor(math.log10(size) + 1e-9))
    return _trim(f"{value:.{min(digits, 6)}f}")


def nice_step(span: float, count: int) -> float:
    """1, 2, 2.5 or 5 times a power of ten, so that about ``count`` ticks cover ``span``."""
    raw = span / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)


def _ticks(low: float, high: float, count: int) -> list[float]:
    """Round values from ``low`` to ``high``, at least three of them."""
    step = nice_step(high - low, count)
    while True:
        first = math.ceil(low / step - 1e-9) * step
        ticks = [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]
        if len(ticks) >= 3:
            return ticks
        step = nice_step(step / 2, 1)


# --- The healthy range ------------------------------------------------------------------------


def _quantile(ordered: Sequence[float], q: float) -> float:
    at = (len(ordered) - 1) * q
    low, high = math.floor(at), math.ceil(at)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def healthy_range(
    points: Sequence[tuple[int, float]], anchors: Sequence[int]
) -> tuple[float, float] | None:
    """The range of the healthy values: the points of each anomaly episode are left out, from
    the run-up into its anchor (a non-finite point, an alert) until the values are back inside
    the range held before; of the rest, the 1st-99th percentiles widened to the extreme values
    within FENCE times that spread. None when nothing is finite."""
    values = [value for _, value in points]
    excluded = [False] * len(points)
    start_from = 0
    for anchor in sorted(anchors):
        index = next((i for i in range(start_from, len(points)) if points[i][0] >= anchor), None)
        if index is None or (start_from > 0 and points[start_from][0] > anchor):
            continue
        start = _run_up(values, start_from, index)
        end = _episode_end(values, excluded, start, index)
        for i in range(start, end):
            excluded[i] = True
        start_from = max(start_from, end)
    kept = sorted(
        v for v, out in zip(values, excluded, strict=True) if not out and math.isfinite(v)
    )
    if len(kept) < MIN_HEALTHY:  # too little history to call anything healthy: all of it
        kept = sorted(v for v in values if math.isfinite(v))
    if not kept:
        return None
    return _fenced_range(kept)


def _episode_end(values: Sequence[float], excluded: Sequence[bool], start: int, index: int) -> int:
    """Where the episode anchored at ``index`` (its run-up from ``start``) ends: at the first
    value back inside the range held before, right after the anchor when there is no before."""
    # The range held before: every healthy value up to the run-up, not only since the
    # last episode (a second alert right after the first has no history of its own).
    before = sorted(
        v for v, out in zip(values[:start], excluded, strict=False) if not out and math.isfinite(v)
    )
    end = index + 1
    if before:
        low, high = _quantile(before, 0.01), _quantile(before, 0.99)
        margin = max(high - low, abs(high) * 0.05, 1e-12) * 0.5
        end = index
        while end < len(values) and not (
            math.isfinite(values[end]) and low - margin <= values[end] <= high + margin
        ):
            end += 1
    return end


def _fenced_range(kept: Sequence[float]) -> tuple[float, float]:
    """The 1st-99th percentiles of the sorted healthy values, widened to the extreme values
    within FENCE times that spread."""
    low, high = _quantile(kept, 0.01), _quantile(kept, 0.99)
    fence = FENCE * max(high - low, abs(high) * 1e-3, 1e-12)
    return (
        min([v for v in kept if v >= low - fence] + [low]),
        max([v for v in kept if v <= high + fence] + [high]),
    )


RUN_UP_LAG = 5  # points: a climb is each value below the one this many points later


def _run_up(values: Sequence[float], floor: int, index: int) -> int:
    """Where the climb into ``index`` began: back over finite values each below the one
    RUN_UP_LAG points later (strictly: a flat or a decaying stretch with a sawtooth is no
    climb), two noisy points in a row allowed."""
    finite = [i for i in range(floor, index) if math.isfinite(values[i])]
    start, dips = index, 0
    for q in range(len(finite) - 1 - RUN_UP_LAG, -1, -1):
        if values[finite[q]] < values[finite[q + RUN_UP_LAG]]:
            dips, start = 0, finite[q]
        else:
            dips += 1
            if dips > 2:
                break
    return start


# --- The chart --------------------------------------------------------------------------------


def chart(
    points: Sequence[tuple[int, float]],
    events: Sequence[tuple[int, str, str]],
    *,
    width: int = 460,
    height: int = 260,
    pad: int = 28,
    metric: str = "",
    phone_width: int | None = 360,
) -> Chart | None:
    """The curve of ``points`` (step, value) with ``events`` (step, label, kind) as markers,
    with its narrower drawing for a phone; None when there is nothing to draw."""
    drawn = _chart(points, events, width=width, height=height, pad=pad, metric=metric)
    if drawn is None or phone_width is None or width <= phone_width:
        return drawn
    phone = _chart(points, events, width=phone_width, height=height, pad=28, metric=metric)
    return replace(drawn, phone=phone)


def _chart(
    points: Sequence[tuple[int, float]],
    events: Sequence[tuple[int, str, str]],
    *,
    width: int,
    height: int,
    pad: int,
    metric: str,
) -> Chart | None:
    points = downsample(sorted(points))
    steps = [step for step, _ in points] + [step for step, _, _ in events]
    if not steps:
        return None
    step_min, step_max = min(steps), max(steps)
    low, high, viewed = _value_view(points, events)
    tick_values, labels, left = _y_axis(low, high, height, pad)
    right = float(width - pad / 2)
    x = _step_scale(step_min, step_max, left, right)
    markers, rows = _markers(events, x, right)
    top, bottom = float(pad / 2 + rows * LABEL_ROW_PX), float(height - pad)
    y = _value_scale(low, high, top, bottom)
    return Chart(
        width=width,
        height=height,
        segments=_segments([(x(step), y(v) if math.isfinite(v) else None) for step, v in points]),
        nonfinite=tuple(x(step) for step, value in points if not math.isfinite(value)),
        markers=_below_top_pad(markers, pad),
        step_min=step_min,
        step_max=step_max,
        value_min=low if viewed else None,
        value_max=high if viewed else None,
        top=top,
        bottom=bottom,
        metric=metric,
        left=left,
        right=right,
        y_ticks=tuple(Tick(y(v), t) for v, t in zip(tick_values, labels, strict=True)),
        x_ticks=_x_ticks(step_min, step_max, x, right - left),
        **_clipped(points, low, high, x),
    )


def _step_scale(step_min: int, step_max: int, left: float, right: float) -> Callable[[int], float]:
    """Where a step is drawn: its x between ``left`` and ``right``."""
    span = step_max - step_min or 1

    def x(step: int) -> float:
        return round(left + (right - left) * (step - step_min) / span, 1)

    return x


def _value_scale(low: float, high: float, top: float, bottom: float) -> Callable[[float], float]:
    """Where a value is drawn: its y between ``bottom`` (``low``) and ``top`` (``high``)."""

    def y(value: float) -> float:
        value = min(high, max(low, value))  # beyond the view: on its edge, and marked
        return round(bottom - (bottom - top) * (value - low) / (high - low), 1)

    return y


def _below_top_pad(markers: Sequence[Marker], pad: int) -> tuple[Marker, ...]:
    """The markers with their label rows moved below the chart's top padding."""
    return tuple(
        Marker(**{**m.__dict__, "label_y": round(pad / 2 + m.label_y, 1)}) for m in markers
    )


def _clipped(points: Sequence[tuple[int, float]], low: float, high: float, x) -> dict:
    """The points beyond the view, drawn on its edges: where (thinned) and how far they went."""
    above = [(s, v) for s, v in points if math.isfinite(v) and v > high]
    below = [(s, v) for s, v in points if math.isfinite(v) and v < low]
    return {
        "clipped_above": _thin([x(s) for s, _ in above]),
        "clipped_below": _thin([x(s) for s, _ in below]),
        "clipped_max": max((v for _, v in above), default=None),
        "clipped_min": min((v for _, v in below), default=None),
    }


def _value_view(
    points: Sequence[tuple[int, float]], events: Sequence[tuple[int, str, str]]
) -> tuple[float, float, bool]:
    """The y range drawn: the healthy values with a little air (the anomaly's run-up left out),
    and whether there were healthy values at all (otherwise a unit range, not a claim)."""
    anchors = [s for s, v in points if not math.isfinite(v)]
    anchors += [s for s, _, kind in events if kind in ("alert_raised", "first_anomalous_point")]
    view = healthy_range(points, anchors)
    low, high = view if view else (0.0, 1.0)
    if high == low:
        return low - (abs(low) * 0.1 or 0.5), high + (abs(high) * 0.1 or 0.5), view is not None
    air = (high - low) * 0.06
    return low - air, high + air, view is not None


def _y_axis(low: float, high: float, height: int, pad: int) -> tuple[list[float], list[str], float]:
    """The y ticks, their labels, and the plot's left edge: wide enough for the longest label."""
    tick_values = _ticks(low, high, max(3, (height - 2 * pad) // 40))
    step_size = tick_values[1] - tick_values[0] if len(tick_values) > 1 else None
    labels = [format_number(v, step_size) for v in tick_values]
    left = max(float(pad), max(len(t) for t in labels) * CHAR_PX + 10) if labels else float(pad)
    return tick_values, labels, left


def _x_ticks(step_min: int, step_max: int, x, room: float) -> tuple[Tick, ...]:
    """Whole steps, about one every 70 px."""
    if step_max == step_min:
        return (Tick(x(step_min), format_number(step_min)),)
    step = max(1.0, nice_step(step_max - step_min, max(2, int(room // 70))))
    first = math.ceil(step_min / step) * step
    count = int((step_max - first) / step + 1e-9) + 1
    return tuple(
        Tick(x(first + i * step), format_number(first + i * step, step)) for i in range(count)
    )


def _markers(events: Sequence[tuple[int, str, str]], x, right: float) -> tuple[list[Marker], int]:
    """Each event's line, and its label in the first row where it covers no other label
    (labels at one step read side by side); past MAX_LABEL_ROWS a label is left out."""
    ends: list[float] = []
    placed = []
    for step, label, kind in sorted(events, key=lambda e: e[0]):
        width = len(label) * CHAR_PX + 4
        want = min(x(step) + 3, right - width)
        row, at = 0, want
        while row < MAX_LABEL_ROWS:
            at = max(want, ends[row] + 6) if row < len(ends) else want
            if at - want <= 90 and at + width <= right:
                break
            row += 1
        shown = row < MAX_LABEL_ROWS
        if shown:
            ends[row : row + 1] = [at + width]
        placed.append(
            Marker(
                x(step),
                step,
                label,
                kind,
                round(at, 1),
                (row + 1) * LABEL_ROW_PX - 3,
                round(width, 1),
                shown,
            )
        )
    return placed, len(ends)


def _thin(xs: Sequence[float], spacing: float = 3.0) -> tuple[float, ...]:
    """At most one edge mark every ``spacing`` px: dozens of points share a pixel."""
    out: list[float] = []
    for value in sorted(xs):
        if not out or value - out[-1] >= spacing:
            out.append(value)
    return tuple(out)


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
