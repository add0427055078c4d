// The job page's live charts (uPlot): history from /series, new points on "metrics.appended",
// zoom = a finer request for the zoomed step range, markers from /markers. The view rules
// (healthy range, number formats, smoothing, label rows) are in chart-math.js; the marker
// lane and the clipped-point marks in chart-marks.js.
(function () {
  "use strict";
  const M = window.BrakelineChartMath, Marks = window.BrakelineChartMarks;
  const jobId = JSON.parse(document.getElementById("job-id").textContent);
  const figures = Array.from(document.querySelectorAll("figure.chart"));
  const worldSize = Number(document.getElementById("charts").dataset.worldSize || 1);
  const MAX_POINTS = 2000;
  const COLORS = ["#6cb6ff", "#3ccf91", "#ffb000", "#c792ea", "#ff8c42", "#7fdbca", "#f78c6c", "#e8edf2"];
  const FONT = "12px system-ui, sans-serif";
  const state = {
    x: "step", y: "healthy", smoothing: 0, compare: "", range: null, rankLines: false, rank: pickedRank(),
    series: {}, markers: { alerts: [], commands: [] }, charts: {}, other: null,
  };
  // The rank whose line is drawn over every rank's min/max band: ?rank= (a link of the ranks
  // table), else rank 0. A thousand ranks are one band from the server, never a thousand lines.
  function pickedRank() {
    const r = parseInt(new URLSearchParams(window.location.search).get("rank"), 10);
    return r >= 0 && r < worldSize ? r : 0;
  }
  const known = new Set();
  figures.forEach(function (f) { names(f).forEach(function (n) { known.add(n); }); });

  function names(figure) { return figure.dataset.names.split(","); }
  // Counters (nonfinite.loss: how many NaN/Inf at a step) share the loss panel but not its
  // units: they get their own scale in the panel's lowest fifth, and mark anomalies.
  function isCount(name, shown) {
    // A panel of counters only (nonfinite.grad on its own) keeps them on its one y axis.
    return name.indexOf("nonfinite.") === 0 && (!shown || shown.some(function (n) { return n.indexOf("nonfinite.") !== 0; }));
  }
  function num(v) { return typeof v === "number" && isFinite(v) ? v : null; }
  function height() { return window.innerWidth < 640 ? 200 : 250; }

  function lastStep(name) {
    const s = state.series[name];
    return s && s.steps.length ? s.steps[s.steps.length - 1] : null;
  }

  function stepToX(step, name) {
    if (state.x === "step") return step;
    const s = state.series[name];
    if (!s || !s.steps.length) return null;
    let lo = 0, hi = s.steps.length - 1;  // nearest loaded point: binary search on steps
    while (lo < hi) { const mid = (lo + hi) >> 1; if (s.steps[mid] < step) lo = mid + 1; else hi = mid; }
    return s.times[lo];
  }

  function xToStep(x, name) {
    if (state.x === "step") return Math.round(x);
    const s = state.series[name];
    let best = null;
    s.times.forEach(function (t, i) { if (best === null || Math.abs(t - x) < Math.abs(s.times[best] - x)) best = i; });
    return best === null ? null : s.steps[best];
  }

  // Where the panel's anomalies are: its non-finite points, counters above zero, its alerts.
  function anchorsOf(figure, shown) {
    const anchors = [];
    shown.forEach(function (name) {
      const s = state.series[name];
      s.values.forEach(function (v, i) {
        if (typeof v === "string" || (name.indexOf("nonfinite.") === 0 && v > 0)) anchors.push(s.steps[i]);
      });
    });
    panelAlerts(figure, shown).forEach(function (a) { anchors.push(a.step); });
    return anchors;
  }

  function panelAlerts(figure, shown) {
    return state.markers.alerts.filter(function (a) {
      return a.step !== null && (shown.indexOf(a.metric) >= 0 || figure.dataset.group === "loss");
    });
  }

  // The earlier attempt: the points between the previous resume (or the start) and a resume,
  // moved to start where the new attempt starts, to compare how both began.
  function attemptBefore(name, resumeStep) {
    const s = state.series[name], resumes = resumeSteps();
    const prev = resumes.filter(function (r) { return r < resumeStep; }).pop();
    const from = prev === undefined ? -Infinity : prev;
    const idx = s.steps.map(function (st, i) { return i; }).filter(function (i) { return s.steps[i] > from && s.steps[i] <= resumeStep; });
    if (!idx.length) return null;
    const shift = resumeStep + 1 - s.steps[idx[0]];
    return { steps: idx.map(function (i) { return s.steps[i] + shift; }), values: idx.map(function (i) { return s.values[i]; }) };
  }

  function resumeSteps() {
    return state.markers.commands.filter(function (c) { return c.kind === "resume" && c.step !== null; })
      .map(function (c) { return c.step; }).sort(function (a, b) { return a - b; });
  }

  function overlayOf(name) {
    if (!state.compare || state.x !== "step") return null;
    if (state.compare.indexOf("resume:") === 0) return attemptBefore(name, parseInt(state.compare.slice(7), 10));
    return state.other && state.other.series[name] && state.other.series[name].steps.length ? state.other.series[name] : null;
  }

  function compareLabel() {
    if (state.compare.indexOf("resume:") === 0) return "before resume (from its start)";
    return state.other ? state.other.label : "earlier run";
  }

  // On the time axis a pause is a gap, not a line across it: a null point is put in the
  // middle of every silence longer than 20 times the usual interval (and 5 s).
  function gapped(table) {
    if (state.x !== "time" || table[0].length < 3) return table;
    const xs = table[0], steps = [];
    for (let i = 1; i < xs.length; i++) steps.push(xs[i] - xs[i - 1]);
    const usual = steps.slice().sort(function (a, b) { return a - b; })[steps.length >> 1];
    const limit = Math.max(5, usual * 20);
    const out = table.map(function () { return []; });
    xs.forEach(function (x, i) {
      if (i && x - xs[i - 1] > limit) out.forEach(function (col, c) { col.push(c ? null : (x + xs[i - 1]) / 2); });
      out.forEach(function (col, c) { col.push(table[c][i]); });
    });
    return out;
  }

  // One uPlot table per shown series; columns described in `meta` (what each is, its raw values).
  function groupData(figure) {
    // A picked rank that logged nothing here (many jobs log on rank 0 only) still shows the
    // band of the ranks that did, its own line empty.
    const shown = names(figure).filter(function (n) {
      const s = state.series[n];
      return s && (s.steps.length || (s.spread && s.spread.steps.length));
    });
    if (!shown.length) return { names: [], data: null };
    const tables = [], meta = [];
    shown.forEach(function (name, i) {
      const s = state.series[name];
      const xs = state.x === "step" ? s.steps : s.times;
      const color = COLORS[i % COLORS.length];
      const cols = [xs], add = function (kind, values, extra) {
        cols.push(values); meta.push(Object.assign({ kind: kind, name: name, color: color }, extra || {}));
      };
      if (isCount(name, shown)) { add("count", s.values.map(num)); tables.push(gapped(cols)); return; }
      add("value", s.values, worldSize > 1 ? { rank: s.rank } : {});
      if (state.smoothing) add("smooth", s.values);
      if (s.band) { add("lower", s.band.lower, { band: s.band }); add("upper", s.band.upper, { band: s.band }); }
      tables.push(gapped(cols));
      // Every rank's min and max per bucket: a grey band around rank 0's line.
      const sp = s.spread;
      if (sp && sp.steps.length && !state.rankLines) {
        const sx = sp.steps.map(function (st) { return stepToX(st, name); });
        tables.push([sx, sp.low, sp.high]);
        meta.push({ kind: "ranks-low", name: name, color: color });
        meta.push({ kind: "ranks-high", name: name, color: color });
      }
      Object.keys(s.ranks || {}).forEach(function (rank, r) {
        const line = s.ranks[rank];
        if (!line.steps.length) return;
        tables.push([state.x === "step" ? line.steps : line.times, line.values]);
        meta.push({ kind: "rank", name: name, rank: rank, color: COLORS[(i + r + 1) % COLORS.length] });
      });
      const ghost = overlayOf(name);
      if (ghost) { tables.push([ghost.steps, ghost.values]); meta.push({ kind: "overlay", name: name, color: color }); }
    });
    const raw = uPlot.join(tables);
    return { names: shown, raw: raw, meta: meta, anchors: anchorsOf(figure, shown) };
  }

  // The y view and the plotted columns: in the healthy view every value beyond the view is
  // drawn on its edge (and marked there by chart-marks.js), so the curve keeps its shape.
  function viewOf(g) {
    let view = null;
    if (state.y === "healthy") {
      g.meta.forEach(function (m, c) {
        const drawnAsLine = m.kind === "value" || m.kind === "ranks-low" || m.kind === "ranks-high" || m.kind === "rank";
        if (!drawnAsLine || m.name.indexOf("nonfinite.") === 0) return;  // counts: all of them
        const r = M.healthyRange(g.raw[0], g.raw[c + 1], g.anchors);
        if (r) view = view ? { min: Math.min(view.min, r.min), max: Math.max(view.max, r.max) } : r;
      });
    }
    const range = view ? M.padded(view.min, view.max) : null;
    const data = [g.raw[0]], clipped = { above: 0, below: 0, max: null, min: null };
    const cols = g.meta.map(function (m, c) {
      let col = g.raw[c + 1].map(function (v) { return v === undefined ? undefined : num(v); });
      if (m.kind === "smooth") col = M.smooth(col, state.smoothing);
      if (m.kind === "count") col = col.map(function (v) { return v ? v : v === 0 ? null : v; });
      if (state.y === "log" && m.kind !== "count") col = col.map(function (v) { return v !== null && v !== undefined && v <= 0 ? null : v; });
      return col;
    });
    g.meta.forEach(function (m, c) {
      let col = cols[c];
      if (range && m.kind === "lower") {
        // A band wider than the view (its window still holds the explosion) says nothing: a gap.
        const upper = cols[c + 1];
        col.forEach(function (v, i) {
          if (v === null || v === undefined || upper[i] === null || upper[i] === undefined) return;
          if (upper[i] - v > range[1] - range[0]) { col[i] = null; upper[i] = null; }
        });
      }
      if (range && m.kind !== "count") col = col.map(function (v) {
        if (v === null || v === undefined) return v;
        if (m.kind === "value") {
          if (v > range[1]) { clipped.above++; clipped.max = Math.max(clipped.max === null ? v : clipped.max, v); }
          if (v < range[0]) { clipped.below++; clipped.min = Math.min(clipped.min === null ? v : clipped.min, v); }
        }
        return Math.min(range[1], Math.max(range[0], v));
      });
      data.push(col);
    });
    return { data: data, range: range || (state.y === "log" ? logRange(g, cols) : null), clipped: clipped };
  }

  // Whole decades around the positive values of the panel's curves.
  function logRange(g, cols) {
    let lo = Infinity, hi = -Infinity;
    g.meta.forEach(function (m, c) {
      if (m.kind !== "value" && m.kind !== "overlay") return;
      cols[c].forEach(function (v) { if (v > 0) { lo = Math.min(lo, v); hi = Math.max(hi, v); } });
    });
    if (!isFinite(lo)) return [0.1, 10];
    lo = Math.pow(10, Math.floor(Math.log10(lo))); hi = Math.pow(10, Math.ceil(Math.log10(hi)));
    return hi === lo ? [lo / 10, hi * 10] : [lo, hi];
  }

  // Decades on a log axis, every n-th one when there are more than the height holds.
  function logSplits(u, ai, min, max) {
    const a = Math.round(Math.log10(min)), b = Math.round(Math.log10(max));
    const room = Math.max(2, Math.floor(u.bbox.height / devicePixelRatio / 28));
    const every = Math.max(1, Math.ceil((b - a) / room));
    const out = [];
    for (let e = a; e <= b; e++) if ((e - a) % every === 0) out.push(Math.pow(10, e));
    return out;
  }

  function measure(texts) {
    const ctx = measure.ctx || (measure.ctx = document.createElement("canvas").getContext("2d"));
    ctx.font = FONT;
    return texts.reduce(function (w, t) { return Math.max(w, t ? ctx.measureText(t).width : 0); }, 0);
  }

  function pad2(n) { return (n < 10 ? "0" : "") + n; }
  function utc(seconds, withDate) {
    const d = new Date(seconds * 1000);
    const hms = pad2(d.getUTCHours()) + ":" + pad2(d.getUTCMinutes()) + ":" + pad2(d.getUTCSeconds());
    return withDate ? d.toISOString().slice(0, 10) + " " + hms + " UTC" : hms;
  }

  // What an axis drew last, for the page's tests (uPlot keeps it only while drawing).
  function drawn(key, what, values) { const c = state.charts[key]; if (c) c[what] = values; return values; }

  function xAxis(key) {
    const axis = {
      stroke: "#93a1ad", font: FONT, labelFont: FONT, grid: { stroke: "#24303a" }, ticks: { stroke: "#24303a" },
      label: state.x === "step" ? "step" : "time (UTC)", labelSize: 18, labelGap: 0, size: 34,
    };
    if (state.x === "step") axis.incrs = STEP_INCRS;  // a step is whole: no tick at 100.5
    axis.values = state.x === "step"
      ? function (u, splits, ai, space, incr) { return drawn(key, "xLabels", splits.map(function (v) { return M.formatNumber(v, incr); })); }
      : function (u, splits, ai, space, incr) {
        return drawn(key, "xLabels", splits.map(function (v) { const t = utc(v, false); return incr >= 60 ? t.slice(0, 5) : t; }));
      };
    return axis;
  }

  // A log axis reads best in one notation: 0.01 … 1000 plain, beyond that 1e6, 1e12, 1e33.
  function decade(v) {
    const e = Math.round(Math.log10(v));
    return e >= -2 && e <= 3 ? M.formatNumber(Math.pow(10, e)) : "1e" + e;
  }

  // uPlot's own increments stop near 1e15: a loss at 3.5e33 would get no tick at all.
  const INCRS = [];
  for (let e = -16; e <= 40; e++) [1, 2, 2.5, 5].forEach(function (m) { INCRS.push(m * Math.pow(10, e)); });
  const STEP_INCRS = INCRS.filter(function (v) { return v >= 1 && v !== 2.5; });

  function yAxis(key) {
    const axis = {
      incrs: INCRS,
      stroke: "#93a1ad", font: FONT, grid: { stroke: "#24303a" }, ticks: { stroke: "#24303a" },
      values: function (u, splits, ai, space, incr) {
        return drawn(key, "yLabels", splits.map(function (v) { return v === null ? null : state.y === "log" ? decade(v) : M.formatNumber(v, incr); }));
      },
      // As wide as the widest label: "000,000" was the tail of a clipped "1,000,000".
      size: function (u, values) { return drawn(key, "ySize", Math.ceil(measure(values || ["0.000"])) + 16); },
    };
    if (state.y === "log") { axis.splits = logSplits; axis.filter = function (u, splits) { return splits; }; }
    return axis;
  }

  function options(figure, g, width) {
    const key = figure.dataset.group, series = [{
      label: state.x === "step" ? "step" : "time (UTC)",
      value: function (u, v) { return v === null || v === undefined ? "—" : state.x === "step" ? String(v) : utc(v, true); },
    }];
    const bands = [];
    g.meta.forEach(function (m, c) {
      const col = c + 1;
      const raw = function (u, v, si, idx) { return idx === null ? "—" : M.formatNumber(state.charts[key].g.raw[col][idx]); };
      // A line needs two points: a series of one or two (a fresh job, a rare metric) gets dots.
      const base = { spanGaps: false, points: { show: fewPoints, size: 8 }, value: raw };
      if (m.kind === "value") {
        const whose = m.rank === undefined ? "" : " · rank " + m.rank;
        series.push(Object.assign(base, { label: m.name + whose, stroke: state.smoothing ? fade(m.color, 0.35) : m.color, width: 1.5 }));
      } else if (m.kind === "smooth") {
        series.push(Object.assign(base, { label: m.name + " (smoothed)", stroke: m.color, width: 2,
          value: function (u, v) { return M.formatNumber(v); } }));
      } else if (m.kind === "lower" || m.kind === "upper") {
        series.push(Object.assign(base, { label: m.name + (m.kind === "lower" ? " band −" : " band +") + m.band.k + "σ",
          stroke: "rgba(255,176,0,0.6)", dash: [4, 4], width: 1 }));
        if (m.kind === "upper") bands.push({ series: [col, col - 1], fill: "rgba(255,176,0,0.12)" });
      } else if (m.kind === "ranks-low" || m.kind === "ranks-high") {
        series.push(Object.assign(base, { label: m.name + (m.kind === "ranks-low" ? " min" : " max") + " of all ranks",
          stroke: "rgba(160,170,180,0.5)", width: 1 }));
        if (m.kind === "ranks-high") bands.push({ series: [col, col - 1], fill: "rgba(160,170,180,0.15)" });
      } else if (m.kind === "rank") {
        series.push(Object.assign(base, { label: m.name + " · rank " + m.rank, stroke: fade(m.color, 0.8), width: 1 }));
      } else if (m.kind === "overlay") {
        series.push(Object.assign(base, { label: m.name + " · " + compareLabel(), stroke: fade(m.color, 0.55), dash: [6, 4], width: 1.5 }));
      } else {
        // Zero most of the time: only the steps that counted something get a dot.
        series.push(Object.assign(base, { label: m.name + " (count)", stroke: "#ff4d4f", width: 1, scale: "n",
          paths: function () { return null; }, points: { show: true, size: 7, fill: "#ff4d4f" } }));
      }
    });
    const y = state.y === "log" ? { distr: 3, log: 10 } : {};
    y.range = function (u, min, max) {
      const chart = state.charts[key], view = chart && chart.view;
      if (view && view.range) return view.range;
      return min === null ? [0, 1] : M.padded(min, max);
    };
    return {
      width: width, height: height(), series: series, bands: bands, legend: { live: true },
      scales: { x: { time: state.x === "time", range: xRange }, y: y, n: { range: function (u, min, max) { return [0, Math.max(1, max || 0) * 5]; } } },
      tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); },
      cursor: { drag: { x: true, y: false, setScale: false }, sync: { key: "job-" + jobId } },
      axes: [xAxis(key), yAxis(key)],
      hooks: {
        draw: [function (u) { Marks.draw(u, figure, markerItems(figure, g.names), state.charts[key]); }],
        setSelect: [function (u) { if (u.select.width > 4) zoomTo(u, g.names[0]); }],
      },
    };
  }

  // One step on the x axis: uPlot runs it from 0 to twice the step (it pads a single x before
  // asking). Centre it instead (a few steps, or a minute, either side); any other range is
  // uPlot's own.
  function xRange(u, min, max) {
    const xs = u.data && u.data[0];
    if (xs && xs.length === 1 && xs[0] !== null && xs[0] !== undefined) min = max = xs[0];
    if (min === null || min !== max) return [min, max];
    const pad = state.x === "step" ? 5 : 60;
    return [state.x === "step" ? Math.max(0, min - pad) : min - pad, max + pad];
  }

  function fewPoints(u, si) {
    const values = u.data[si] || [];
    let n = 0;
    for (let i = 0; i < values.length && n < 3; i++) if (values[i] !== null && values[i] !== undefined) n++;
    return n > 0 && n < 3;
  }

  function fade(hex, alpha) {
    const n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + alpha + ")";
  }

  // Every vertical marker of a panel: one per run of non-finite points, its alerts, commands.
  function markerItems(figure, shown) {
    const items = [], ref = shown[0];
    shown.forEach(function (name) {
      if (isCount(name, shown)) return;
      const s = state.series[name];
      s.values.forEach(function (v, i) {
        if (typeof v === "string" && typeof s.values[i - 1] !== "string") {
          items.push({ step: s.steps[i], label: v === "NaN" ? "NaN" : v.replace("Infinity", "Inf"), kind: "nonfinite", color: "#ff4d4f", dash: [2, 3], title: name + " = " + v + " at step " + s.steps[i] });
        }
      });
    });
    const levels = { L1: "#6cb6ff", L2: "#ffd43b", L3: "#ff8c42", L4: "#ff4d4f" };
    panelAlerts(figure, shown).forEach(function (a) {
      items.push({ step: a.step, label: a.severity, kind: "alert", color: levels[a.severity] || "#fff", dash: [6, 4], title: a.label + " at step " + a.step });
    });
    state.markers.commands.forEach(function (c) {
      if (c.step !== null) items.push({ step: c.step, label: c.label, kind: "command", color: c.kind === "resume" ? "#3ccf91" : "#c792ea", dash: [], title: c.label + " (" + c.status + ") at step " + c.step });
    });
    return items.map(function (item) { return Object.assign(item, { x: stepToX(item.step, ref) }); })
      .filter(function (item) { return item.x !== null; });
  }

  function render(figure) {
    const plot = figure.querySelector(".plot");
    const g = groupData(figure);
    const key = figure.dataset.group;
    if (!g.data && !g.raw) { plot.innerHTML = '<p class="empty">No points yet.</p>'; return; }
    const view = viewOf(g);
    const shape = g.meta.map(function (m) { return m.kind + ":" + m.name + (m.rank === undefined ? "" : "@" + m.rank); }).join(",") + "|" + state.x + "|" + state.y + "|" + state.compare;
    let chart = state.charts[key];
    if (chart && chart.shape === shape) {
      chart.g = g; chart.view = view;
      chart.plot.setData(view.data);
    } else {
      if (chart) chart.plot.destroy();
      plot.innerHTML = "";
      chart = state.charts[key] = { shape: shape, g: g, view: view };
      chart.plot = new uPlot(options(figure, g, plot.clientWidth || 800), view.data, plot);
    }
    const last = lastStep(g.names[0]);
    figure.dataset.lastStep = last === null ? "" : last;
    figure.dataset.points = state.series[g.names[0]].steps.length;
    figure.dataset.rank = state.series[g.names[0]].rank;
    caption(figure, g, view);
  }

  function caption(figure, g, view) {
    const band = g.meta.filter(function (m) { return m.kind === "upper"; })[0];
    const note = figure.querySelector(".band-note");
    if (note) note.textContent = band ? "band: " + band.band.rule + ", mean ± " + band.band.k + "σ of the last " + band.band.window + " points" : "";
    const clip = figure.querySelector(".clip-note"), c = view.clipped, parts = [];
    if (c.above) parts.push("▲ " + c.above + " point" + (c.above > 1 ? "s" : "") + " above the view, up to " + M.formatNumber(c.max));
    if (c.below) parts.push("▼ " + c.below + " below, down to " + M.formatNumber(c.min));
    clip.textContent = parts.join(" · ");
    clip.hidden = !parts.length;
    figure.dataset.clipped = c.above + c.below;
    const overlay = g.meta.filter(function (m) { return m.kind === "overlay"; })[0];
    figure.dataset.overlay = overlay ? compareLabel() : "";
  }

  async function fetchSeries(names, fromStep, toStep, job) {
    const params = new URLSearchParams({ names: names.join(","), max_points: MAX_POINTS });
    if (fromStep !== null && fromStep !== undefined) params.set("from_step", fromStep);
    if (toStep !== null && toStep !== undefined) params.set("to_step", toStep);
    if (!job && worldSize > 1) params.set("rank", state.rank);
    if (state.rankLines && !job) {
      params.set("ranks", Array.from({ length: Math.min(worldSize, 16) }, function (_, r) { return r; }).join(","));
      params.set("spread", "0");
    }
    const response = await fetch("/api/v1/jobs/" + (job || jobId) + "/series?" + params, { credentials: "same-origin" });
    if (!response.ok) throw new Error("series " + response.status);
    return (await response.json()).series;
  }

  async function loadAll() {
    const from = state.range ? state.range.from : null, to = state.range ? state.range.to : null;
    await Promise.all(figures.map(async function (figure) {
      const got = await fetchSeries(names(figure), from, to);
      Object.assign(state.series, got);
      render(figure);
    }));
    document.getElementById("zoom-reset").hidden = !state.range;
  }

  // New points: fetch what comes after the last step we hold (also the catch-up on reconnect).
  let appending = false, appendAgain = false;
  async function append() {
    if (state.range) return;  // zoomed in: the view stays put ("Whole run" follows again)
    if (appending) { appendAgain = true; return; }
    appending = true;
    try {
      await Promise.all(figures.map(async function (figure) {
        const ns = names(figure);
        const since = Math.min.apply(null, ns.map(function (n) { const l = lastStep(n); return l === null ? -1 : l; }));
        const got = await fetchSeries(ns, since + 1, null);
        let grew = false;
        ns.forEach(function (n) { grew = merge(n, got[n]) || grew; });
        if (grew) render(figure);
      }));
    } catch (error) { /* the next event or the reconnect catches up */ }
    appending = false;
    if (appendAgain) { appendAgain = false; append(); }
  }

  function merge(name, fresh) {
    const held = state.series[name];
    if (!held || !held.steps.length) { state.series[name] = fresh; return fresh.steps.length > 0; }
    const last = held.steps[held.steps.length - 1];
    let grew = false;
    fresh.steps.forEach(function (step, i) {
      if (step <= last) return;
      grew = true;
      held.steps.push(step); held.times.push(fresh.times[i]); held.values.push(fresh.values[i]);
      if (held.band && fresh.band) { held.band.lower.push(fresh.band.lower[i]); held.band.upper.push(fresh.band.upper[i]); }
    });
    // The spread and the other ranks' lines: what comes after what is held, the same way.
    const sp = held.spread, fsp = fresh.spread;
    if (sp && fsp) {
      const end = sp.steps.length ? sp.steps[sp.steps.length - 1] : -1;
      fsp.steps.forEach(function (step, i) {
        if (step > end) { sp.steps.push(step); sp.low.push(fsp.low[i]); sp.high.push(fsp.high[i]); grew = true; }
      });
    }
    Object.keys(fresh.ranks || {}).forEach(function (rank) {
      const line = (held.ranks || {})[rank], more = fresh.ranks[rank];
      if (!line) return;
      const end = line.steps.length ? line.steps[line.steps.length - 1] : -1;
      more.steps.forEach(function (step, i) {
        if (step > end) { line.steps.push(step); line.times.push(more.times[i]); line.values.push(more.values[i]); grew = true; }
      });
    });
    if (held.steps.length > 2 * MAX_POINTS) setTimeout(loadAll, 0);  // downsample afresh
    return grew;
  }

  function zoomTo(u, name) {
    const a = u.posToVal(u.select.left, "x"), b = u.posToVal(u.select.left + u.select.width, "x");
    u.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
    state.range = { from: xToStep(a, name), to: xToStep(b, name) };
    loadAll();
  }

  async function loadMarkers() {
    try {
      const response = await fetch("/api/v1/jobs/" + jobId + "/markers", { credentials: "same-origin" });
      if (response.ok) state.markers = await response.json();
      compareOptions();
      figures.forEach(function (f) { if (state.charts[f.dataset.group]) render(f); });
    } catch (error) { /* next event */ }
  }

  // "Compare with": the attempt before each resume, and the other runs of the team.
  let otherJobs = [];
  function compareOptions() {
    const select = document.getElementById("compare");
    const chosen = state.compare, options = [["", "nothing"]];
    resumeSteps().forEach(function (step) { options.push(["resume:" + step, "attempt before the resume at step " + step]); });
    otherJobs.forEach(function (j) { options.push(["job:" + j.id, "run " + j.team + "/" + j.name]); });
    select.innerHTML = "";
    options.forEach(function (o) { const opt = document.createElement("option"); opt.value = o[0]; opt.textContent = o[1]; select.appendChild(opt); });
    select.value = options.some(function (o) { return o[0] === chosen; }) ? chosen : "";
  }

  async function loadJobs() {
    try {
      const response = await fetch("/api/v1/jobs", { credentials: "same-origin" });
      const body = response.ok ? await response.json() : [];
      const all = Array.isArray(body) ? body : body.results || [];
      otherJobs = all.filter(function (j) { return j.id !== jobId; }).slice(0, 50);
      compareOptions();
    } catch (error) { /* the list stays short */ }
  }

  async function compareWith(value) {
    state.compare = value;
    state.other = null;
    if (value.indexOf("job:") === 0) {
      const id = parseInt(value.slice(4), 10), job = otherJobs.filter(function (j) { return j.id === id; })[0];
      const all = [];
      figures.forEach(function (f) { names(f).forEach(function (n) { all.push(n); }); });
      state.other = { label: job ? job.name : "run " + id, series: await fetchSeries(all, null, null, id) };
    }
    document.getElementById("compare-note").hidden = !(value && state.x !== "step");
    figures.forEach(render);
  }

  Brakeline.subscribe("job", jobId);
  Brakeline.on("metrics", function (message) {
    if (message.job_id !== jobId) return;
    const step = document.getElementById("job-step");
    if (step && (parseInt(step.textContent, 10) || -1) < message.last_step) step.textContent = message.last_step;
    const unknown = Object.keys(message.latest).filter(function (n) { return !known.has(n); });
    if (unknown.length) {
      const note = document.getElementById("new-metrics");
      note.hidden = false;
      note.textContent = "new metrics " + unknown.join(", ") + ": reload to chart them";
    }
    append();
  });
  ["alert", "command", "executor"].forEach(function (family) { Brakeline.on(family, loadMarkers); });
  Brakeline.onReconnect(function () { append(); loadMarkers(); });

  function toggles(attribute, apply) {
    document.querySelectorAll("button.toggle[data-" + attribute + "]").forEach(function (button) {
      button.addEventListener("click", function () {
        document.querySelectorAll("button.toggle[data-" + attribute + "]").forEach(function (b) {
          b.classList.toggle("on", b === button); b.setAttribute("aria-pressed", b === button);
        });
        apply(button.dataset[attribute]);
        figures.forEach(render);
      });
    });
  }
  toggles("x", function (v) { state.x = v; document.getElementById("compare-note").hidden = !(state.compare && v !== "step"); });
  toggles("y", function (v) { state.y = v; });
  document.getElementById("smoothing").addEventListener("change", function (event) {
    state.smoothing = parseFloat(event.target.value) || 0;
    figures.forEach(render);
  });
  document.getElementById("compare").addEventListener("change", function (event) { compareWith(event.target.value); });
  document.getElementById("zoom-reset").addEventListener("click", function () { state.range = null; loadAll(); });
  const rankView = document.getElementById("rank-view");
  if (rankView) rankView.addEventListener("change", function () { state.rankLines = rankView.value === "lines"; loadAll(); });
  const rankPick = document.getElementById("rank-pick");
  if (rankPick) {
    rankPick.value = state.rank;
    rankPick.addEventListener("change", function () {
      const r = parseInt(rankPick.value, 10);
      if (r >= 0 && r < worldSize) pickRank(r); else rankPick.value = state.rank;
    });
  }
  function pickRank(rank) {
    state.rank = rank;
    if (rankPick) rankPick.value = rank;
    return loadAll();
  }
  let resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () {
      Object.keys(state.charts).forEach(function (key) {
        const plot = document.querySelector('figure[data-group="' + key + '"] .plot');
        state.charts[key].plot.setSize({ width: plot.clientWidth, height: height() });
      });
    }, 150);
  });

  window.BrakelineCharts = {
    state: state, lastStep: lastStep, compareWith: compareWith, pickRank: pickRank,
    ready: Promise.all([loadAll(), loadMarkers(), loadJobs()]),
  };
})();
