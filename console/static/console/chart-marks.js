// What the job page's charts draw over the curves: a vertical line per marker (non-finite
// point, alert, command) on the canvas, the markers' labels in a lane of HTML rows above the
// plot (never over each other, so "NaN L3 paused resumed" at one step stays readable and the
// labels can be hovered, read by a screen reader and checked by a test), and a small triangle
// on the edge where a value beyond the healthy view was drawn clipped.
(function (root) {
  "use strict";
  const M = root.BrakelineChartMath;
  const LABEL_FONT = "600 11px system-ui, sans-serif";
  const MAX_ROWS = 4;
  let ctx2d = null;

  function textWidth(text) {
    ctx2d = ctx2d || document.createElement("canvas").getContext("2d");
    ctx2d.font = LABEL_FONT;
    return Math.ceil(ctx2d.measureText(text).width) + 10;  // the chip's padding
  }

  function lines(u, items) {
    const ctx = u.ctx, top = u.bbox.top, bottom = top + u.bbox.height, dpr = devicePixelRatio;
    ctx.save();
    items.forEach(function (item) {
      if (item.x < u.scales.x.min || item.x > u.scales.x.max) return;
      const px = Math.round(u.valToPos(item.x, "x", true)) + 0.5;
      ctx.strokeStyle = item.color; ctx.lineWidth = 1.5 * dpr;
      ctx.setLineDash(item.dash.map(function (d) { return d * dpr; }));
      ctx.beginPath(); ctx.moveTo(px, top); ctx.lineTo(px, bottom); ctx.stroke();
    });
    ctx.restore();
  }

  // Values beyond the view: a triangle on the top (or bottom) edge, at most one per 3 px.
  function clippedMarks(u, chart) {
    const range = chart.view && chart.view.range;
    if (!range) return;
    const ctx = u.ctx, dpr = devicePixelRatio, top = u.bbox.top, bottom = top + u.bbox.height;
    ctx.save();
    ctx.fillStyle = "#ff4d4f";
    chart.g.meta.forEach(function (m, c) {
      if (m.kind !== "value") return;
      const xs = chart.g.raw[0], raw = chart.g.raw[c + 1];
      let lastUp = -1e9, lastDown = -1e9;
      for (let i = 0; i < raw.length; i++) {
        const v = raw[i];
        if (typeof v !== "number" || !isFinite(v) || (v <= range[1] && v >= range[0])) continue;
        if (xs[i] < u.scales.x.min || xs[i] > u.scales.x.max) continue;
        const px = u.valToPos(xs[i], "x", true), up = v > range[1];
        if (up ? px - lastUp < 3 * dpr : px - lastDown < 3 * dpr) continue;
        if (up) lastUp = px; else lastDown = px;
        const y = up ? top : bottom, s = 4 * dpr, dir = up ? 1 : -1;
        ctx.beginPath(); ctx.moveTo(px, y); ctx.lineTo(px - s, y + dir * 1.6 * s); ctx.lineTo(px + s, y + dir * 1.6 * s);
        ctx.closePath(); ctx.fill();
      }
    });
    ctx.restore();
  }

  function lane(u, figure, items) {
    const el = figure.querySelector(".marker-lane");
    if (!el) return;
    const left = u.bbox.left / devicePixelRatio, width = u.bbox.width / devicePixelRatio;
    const visible = items.filter(function (item) { return item.x >= u.scales.x.min && item.x <= u.scales.x.max; })
      .map(function (item) { return Object.assign({}, item, { x: u.valToPos(item.x, "x"), width: textWidth(item.label) }); });
    const layout = M.layoutLabels(visible, width, MAX_ROWS, 4);
    el.innerHTML = "";
    layout.placed.forEach(function (item) {
      const chip = document.createElement("span");
      chip.className = "marker-label marker-" + item.kind;
      chip.textContent = item.label;
      chip.title = item.title;
      chip.style.left = (left + item.left) + "px";
      chip.style.top = (item.row * 18) + "px";
      chip.style.color = item.color;
      chip.style.borderColor = item.color;
      el.appendChild(chip);
    });
    let rows = layout.rows;
    if (layout.hidden.length) {  // more labels than rows: say so, and name them on hover
      const more = document.createElement("span");
      more.className = "marker-label marker-more";
      more.textContent = "+" + layout.hidden.length + " more";
      more.title = layout.hidden.map(function (h) { return h.title; }).join("\n");
      more.style.left = left + "px";
      more.style.top = (rows * 18) + "px";
      el.appendChild(more);
      rows++;
    }
    el.style.height = Math.max(rows, 1) * 18 + "px";
    el.dataset.rows = rows;
  }

  root.BrakelineChartMarks = {
    draw: function (u, figure, items, chart) {
      lines(u, items);
      if (chart) clippedMarks(u, chart);
      lane(u, figure, items);
    },
  };
})(window);
