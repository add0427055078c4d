// The job page's live charts (uPlot): history from /series, new points on "metrics.appended",
// zoom = a finer request for the zoomed step range, markers from /markers.
(function () {
  "use strict";
  const jobId = JSON.parse(document.getElementById("job-id").textContent);
  const figures = Array.from(document.querySelectorAll("figure.chart"));
  const MAX_POINTS = 2000;
  const COLORS = ["#6cb6ff", "#3ccf91", "#ffb000", "#c792ea", "#ff8c42", "#7fdbca", "#f78c6c", "#e8edf2"];
  const LEVEL_COLORS = { L1: "#6cb6ff", L2: "#ffd43b", L3: "#ff8c42", L4: "#ff4d4f" };
  const state = { x: "step", range: null, series: {}, markers: { alerts: [], commands: [] }, charts: {} };
  const known = new Set();
  figures.forEach(function (f) { f.dataset.names.split(",").forEach(function (n) { known.add(n); }); });

  function num(v) { return typeof v === "number" ? v : null; }  // "NaN"/"Infinity": a gap + a marker

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

  function tableOf(name) {
    const s = state.series[name];
    return [state.x === "step" ? s.steps : s.times, s.values.map(num)];
  }

  function groupData(figure) {
    const names = figure.dataset.names.split(",").filter(function (n) { return state.series[n] && state.series[n].steps.length; });
    if (!names.length) return { names: [], data: null };
    const withBand = names.length === 1 && state.series[names[0]].band;
    if (names.length === 1) {
      const t = tableOf(names[0]);
      const band = state.series[names[0]].band;
      return { names: names, data: withBand ? [t[0], t[1], band.lower, band.upper] : t, band: withBand };
    }
    return { names: names, data: uPlot.join(names.map(tableOf)), band: false };
  }

  function drawMarkers(u, figure, names) {
    const ctx = u.ctx, top = u.bbox.top, height = u.bbox.height, ref = names[0];
    ctx.save();
    ctx.font = (11 * devicePixelRatio) + "px system-ui, sans-serif";
    function vline(step, color, label, dash, row) {
      const x = stepToX(step, ref);
      if (x === null || x < u.scales.x.min || x > u.scales.x.max) return;
      const px = u.valToPos(x, "x", true);
      ctx.strokeStyle = color; ctx.fillStyle = color; ctx.lineWidth = 1.5 * devicePixelRatio;
      ctx.setLineDash(dash);
      ctx.beginPath(); ctx.moveTo(px, top); ctx.lineTo(px, top + height); ctx.stroke();
      ctx.setLineDash([]);
      // One label row per kind (values, alerts, commands), so coinciding markers stay legible.
      if (label) ctx.fillText(label, px + 4 * devicePixelRatio, top + (12 + 14 * row) * devicePixelRatio);
    }
    names.forEach(function (name) {  // non-finite points: a red tick at the bottom and a label
      const s = state.series[name];
      s.values.forEach(function (v, i) { if (typeof v === "string") vline(s.steps[i], "#ff4d4f", v, [2, 3], 0); });
    });
    state.markers.alerts.forEach(function (a) {
      if (names.indexOf(a.metric) >= 0 || figure.dataset.group === "loss") {
        vline(a.step, LEVEL_COLORS[a.severity] || "#fff", a.severity, [6, 4], 1);
      }
    });
    state.markers.commands.forEach(function (c) { if (c.step !== null) vline(c.step, "#c792ea", c.label, [1, 0], 2); });
    ctx.restore();
  }

  function options(figure, g, width) {
    const series = [{}];
    g.names.forEach(function (name, i) {
      series.push({ label: name, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: false,
        points: { show: false } });
    });
    const opts = {
      width: width, height: 230, series: series, legend: { live: true },
      scales: { x: { time: state.x === "time" } },
      cursor: { drag: { x: true, y: false, setScale: false }, sync: { key: "job-" + jobId } },
      axes: [
        { stroke: "#93a1ad", grid: { stroke: "#24303a" }, ticks: { stroke: "#24303a" } },
        { stroke: "#93a1ad", grid: { stroke: "#24303a" }, ticks: { stroke: "#24303a" }, size: 60 },
      ],
      hooks: {
        draw: [function (u) { drawMarkers(u, figure, g.names); }],
        setSelect: [function (u) { if (u.select.width > 4) zoomTo(u, g.names[0]); }],
      },
    };
    if (g.band) {
      series.push({ label: "band −kσ", stroke: "rgba(255,176,0,0.55)", dash: [4, 4], width: 1, points: { show: false } });
      series.push({ label: "band +kσ", stroke: "rgba(255,176,0,0.55)", dash: [4, 4], width: 1, points: { show: false } });
      opts.bands = [{ series: [3, 2], fill: "rgba(255,176,0,0.10)" }];
    }
    return opts;
  }

  function render(figure) {
    const plot = figure.querySelector(".plot");
    const g = groupData(figure);
    const key = figure.dataset.group;
    const shape = g.names.join(",") + "|" + !!g.band + "|" + state.x;
    const chart = state.charts[key];
    if (!g.data) { plot.innerHTML = '<p class="empty">No points yet.</p>'; return; }
    if (chart && chart.shape === shape) {
      chart.plot.setData(g.data);
    } else {
      if (chart) chart.plot.destroy();
      plot.innerHTML = "";
      state.charts[key] = { shape: shape, plot: new uPlot(options(figure, g, plot.clientWidth || 800), g.data, plot) };
    }
    const last = lastStep(g.names[0]);
    figure.dataset.lastStep = last === null ? "" : last;
    figure.dataset.points = state.series[g.names[0]].steps.length;
    if (g.band) {
      const b = state.series[g.names[0]].band;
      figure.querySelector(".band-note").textContent = "band: " + b.rule + " mean ± " + b.k + "σ of the last " + b.window + " points";
    }
  }

  async function fetchSeries(names, fromStep, toStep) {
    const params = new URLSearchParams({ names: names.join(","), max_points: MAX_POINTS });
    if (fromStep !== null && fromStep !== undefined) params.set("from_step", fromStep);
    if (toStep !== null && toStep !== undefined) params.set("to_step", toStep);
    const response = await fetch("/api/v1/jobs/" + jobId + "/series?" + params, { credentials: "same-origin" });
    if (!response.ok) throw new Error("series " + response.status);
    return (await response.json()).series;
  }

  async function loadAll() {
    const from = state.range ? state.range.from : null, to = state.range ? state.range.to : null;
    await Promise.all(figures.map(async function (figure) {
      const got = await fetchSeries(figure.dataset.names.split(","), from, to);
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
        const names = figure.dataset.names.split(",");
        const since = Math.min.apply(null, names.map(function (n) { const l = lastStep(n); return l === null ? -1 : l; }));
        const got = await fetchSeries(names, since + 1, null);
        let grew = false;
        names.forEach(function (n) { grew = merge(n, got[n]) || grew; });
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
      Object.values(state.charts).forEach(function (c) { c.plot.redraw(false, false); });
    } catch (error) { /* next event */ }
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

  document.querySelectorAll("button.toggle").forEach(function (button) {
    button.addEventListener("click", function () {
      state.x = button.dataset.x;
      document.querySelectorAll("button.toggle").forEach(function (b) { b.classList.toggle("on", b === button); });
      figures.forEach(render);
    });
  });
  document.getElementById("zoom-reset").addEventListener("click", function () { state.range = null; loadAll(); });
  let resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () {
      Object.keys(state.charts).forEach(function (key) {
        const plot = document.querySelector('figure[data-group="' + key + '"] .plot');
        state.charts[key].plot.setSize({ width: plot.clientWidth, height: 230 });
      });
    }, 150);
  });

  window.BrakelineCharts = { state: state, lastStep: lastStep, ready: Promise.all([loadAll(), loadMarkers()]) };
})();
