// Pure helpers of the job page's charts (no DOM, no uPlot): the robust "healthy" y range,
// number formatting for ticks and legends, smoothing, and the layout of marker labels.
// Kept apart from job.js so each rule lives in one place and can be reasoned about alone.
(function (root) {
  "use strict";

  function isNum(v) { return typeof v === "number" && isFinite(v); }

  function quantile(sorted, q) {
    if (!sorted.length) return null;
    const at = (sorted.length - 1) * q, lo = Math.floor(at), hi = Math.ceil(at);
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (at - lo);
  }

  // Beyond the percentiles by more than FENCE times their spread is an outlier: a learning
  // rate's warm-up or a loss spike of a few times its noise stay in view, 1e33 does not.
  const FENCE = 10;

  // The range of the "healthy" values of a series: what a person wants to read when a loss
  // explodes to 1e33 before its NaN. Points of an anomaly episode are left out: from the
  // monotone run-up before each anchor (a non-finite point or an alert of this panel) until
  // the series is back inside the range it held before. Of what remains, the 1st-99th
  // percentiles, widened to the extreme values that lie within FENCE times that spread.
  function healthyRange(steps, values, anchors) {
    const excluded = new Uint8Array(values.length);
    const sortedAnchors = (anchors || []).slice().sort(function (a, b) { return a - b; });
    let from = 0;
    sortedAnchors.forEach(function (anchor) {
      let i = from;
      while (i < steps.length && steps[i] < anchor) i++;
      if (i >= steps.length || (from > 0 && steps[from] > anchor)) return;  // inside the last episode
      const start = runUp(values, from, i);
      // The range held before: every healthy value up to the run-up, not only since the last
      // episode (a second alert right after the first has no history of its own).
      const before = finiteSorted(values, 0, start, excluded);
      const lo = quantile(before, 0.01), hi = quantile(before, 0.99);
      const margin = before.length ? Math.max(hi - lo, Math.abs(hi) * 0.05, 1e-12) * 0.5 : 0;
      // The episode lasts while the series stays above the earlier range: the run-up is a
      // climb, and a loss that goes on falling below everything before is learning, not the
      // anomaly, so it stays in view.
      let end = i;
      while (end < steps.length && (!isNum(values[end]) ||
             (before.length && values[end] > hi + margin))) end++;
      if (!before.length) end = i + 1;
      for (let n = start; n < end; n++) excluded[n] = 1;
      from = Math.max(from, end);
    });
    let kept = finiteSorted(values, 0, values.length, excluded);
    // Too little history to call anything healthy (a run's first points): all of it.
    if (kept.length < 10) kept = finiteSorted(values, 0, values.length, null);
    if (!kept.length) return null;
    const lo = quantile(kept, 0.01), hi = quantile(kept, 0.99);
    const fence = FENCE * Math.max(hi - lo, Math.abs(hi) * 1e-3, 1e-12);
    let min = lo, max = hi;
    kept.forEach(function (v) { if (v >= lo - fence && v < min) min = v; if (v <= hi + fence && v > max) max = v; });
    return { min: min, max: max };
  }

  // Where the climb into index `to` began: back over finite values each below the one LAG
  // points later (strictly: a flat or decaying stretch with a sawtooth is no climb), two
  // noisy points in a row allowed.
  const LAG = 5;
  function runUp(values, from, to) {
    const fin = [];
    for (let n = from; n < to; n++) if (isNum(values[n])) fin.push(n);
    let start = to, dips = 0;
    for (let q = fin.length - 1 - LAG; q >= 0; q--) {
      if (values[fin[q]] < values[fin[q + LAG]]) { dips = 0; start = fin[q]; }
      else if (++dips > 2) break;
    }
    return start;
  }

  function finiteSorted(values, from, to, excluded) {
    const out = [];
    for (let i = from; i < to; i++) if (isNum(values[i]) && !(excluded && excluded[i])) out.push(values[i]);
    return out.sort(function (a, b) { return a - b; });
  }

  // A view range with a little air, never empty.
  function padded(min, max) {
    if (min === max) { const d = Math.abs(min) * 0.1 || 1; return [min - d, max + d]; }
    const pad = (max - min) * 0.06;
    return [min - pad, max + pad];
  }

  const SI = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];

  // A number for a person: SI prefixes from a thousand to a trillion, exponent notation beyond
  // and below a thousandth, never a string of 37 digits. `step` (a tick increment) fixes the
  // decimals so that neighbouring ticks differ in what they print.
  function formatNumber(v, step) {
    if (typeof v === "string") return v;  // "NaN", "Infinity"
    if (v === null || v === undefined || !isFinite(v)) return "—";
    if (v === 0) return "0";
    const a = Math.abs(v);
    if (a >= 1e15 || a < 1e-3) return expo(v, step);
    for (let i = 0; i < SI.length; i++) {
      if (a >= SI[i][0]) return trim((v / SI[i][0]).toFixed(decimals(step ? step / SI[i][0] : null, v / SI[i][0]))) + SI[i][1];
    }
    return trim(v.toFixed(decimals(step, v)));
  }

  // As many decimals as the tick increment has (0.25 → 2, 0.2 → 1), or 4 significant digits.
  function decimals(step, v) {
    if (step) {
      const a = Math.abs(step);
      for (let d = 0; d < 8; d++) {
        const scaled = a * Math.pow(10, d);
        if (Math.abs(Math.round(scaled) - scaled) < 1e-6 * scaled) return d;
      }
      return 8;
    }
    return Math.min(6, Math.max(0, 3 - Math.floor(Math.log10(Math.abs(v)) + 1e-9)));
  }

  function expo(v, step) {
    const e = Math.floor(Math.log10(Math.abs(v)) + 1e-9);
    const digits = step ? Math.min(5, decimals(step / Math.pow(10, e))) : 2;
    const parts = v.toExponential(digits).split("e");
    return trim(parts[0]) + "e" + (parts[1][0] === "+" ? parts[1].slice(1) : parts[1]);
  }

  function trim(s) { return s.indexOf(".") < 0 ? s : s.replace(/\.?0+$/, ""); }

  // Exponential moving average with the start-up bias removed (what TensorBoard and W&B
  // call smoothing); a non-finite point ends the run, the next one starts afresh.
  function smooth(values, weight) {
    if (!weight) return values.slice();
    const out = new Array(values.length);
    let acc = 0, n = 0;
    for (let i = 0; i < values.length; i++) {
      const v = values[i];
      if (!isNum(v)) { out[i] = null; acc = 0; n = 0; continue; }
      acc = acc * weight + (1 - weight) * v; n++;
      out[i] = acc / (1 - Math.pow(weight, n));
    }
    return out;
  }

  // Marker labels in rows so that no two overlap. A label goes right of its line, pushed
  // further right past the labels already in a row by up to `slack` px (so the labels of
  // markers at one step read as one line: "L3 NaN paused resumed"), else into the next row;
  // past `maxRows` it is left out (its line still shows, and the caller lists it). A label
  // that would run off the right edge ends at the edge instead.
  function layoutLabels(items, width, maxRows, gap, slack) {
    const rows = [], placed = [], hidden = [];
    slack = slack === undefined ? 120 : slack;
    items.slice().sort(function (a, b) { return a.x - b.x; }).forEach(function (item) {
      const want = Math.max(0, Math.min(item.x + 3, width - item.width));
      let row = 0, left = want;
      for (; row < maxRows; row++) {
        left = row < rows.length ? Math.max(want, rows[row] + gap) : want;
        if (left - want <= slack && left + item.width <= width) break;
      }
      if (row >= maxRows) { hidden.push(item); return; }
      rows[row] = left + item.width;
      placed.push(Object.assign({}, item, { left: left, row: row }));
    });
    return { placed: placed, hidden: hidden, rows: rows.length };
  }

  root.BrakelineChartMath = {
    quantile: quantile, healthyRange: healthyRange, padded: padded, formatNumber: formatNumber,
    smooth: smooth, layoutLabels: layoutLabels,
  };
})(window);
