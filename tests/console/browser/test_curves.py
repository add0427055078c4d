"""The job page's curves on the demo's own data shape: a healthy, decaying loss, then the
learning-rate bug's explosion to ~3.5e33, Inf gradients, a NaN, the L3 pause, a resume and
healthy training again. Everything is read from the rendered chart (uPlot's scales and the
drawn labels), at a desktop and a 390 px phone. Screenshots land in docs/screenshots/."""

from __future__ import annotations

import math
import random
import re

import pytest
from playwright.sync_api import expect

from breakers.control.job_actions import resume_job
from breakers.detection.rules import install_default_pack
from incidents.models import Incident, Role
from tests.console.browser.conftest import SCREENSHOTS
from tests.console.browser.test_live_console import in_thread

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
DIVERGE, INF_GRAD, NAN = 500, 557, 558


def demo_points(step: int, rng: random.Random, resumed: bool = False) -> dict[str, float | str]:
    """One step of console/demo_training.py as the SDK reports it: an MSE loss falling from
    ~1.1 to ~0.02; from DIVERGE the learning rate grows 1.08× a step and the loss explodes
    super-exponentially to ~3.5e33, the gradients overflow at INF_GRAD, the loss is NaN at NAN.
    After the resume the run is back on its healthy checkpoint."""
    healthy = (0.02 + 1.1 * math.exp(-step / 80)) * rng.uniform(0.8, 1.2)
    lr = 0.02
    if resumed or step < DIVERGE:
        loss, grad = healthy, 0.4 + 2.0 * math.exp(-step / 60) + rng.uniform(0, 0.15)
    else:
        lr = 0.02 * 1.08 ** (step - DIVERGE)
        loss = 0.03 * 10 ** (35.07 * ((step - DIVERGE) / (INF_GRAD - DIVERGE)) ** 2)
        loss *= rng.uniform(0.9, 1.1)
        grad = math.sqrt(loss) * 40
    points: dict[str, float | str] = {
        "loss": "NaN" if step >= NAN and not resumed else loss,
        "grad_norm": "Infinity" if step >= INF_GRAD and not resumed else grad,
        "lr": lr,
        "nonfinite.loss": 1.0 if step >= NAN and not resumed else 0.0,
        "perf.samples_per_second": 950 + rng.gauss(0, 15),
    }
    return points


def post(agent, steps, rng, resumed=False) -> None:
    batch = []
    for step in steps:
        for name, value in demo_points(step, rng, resumed).items():
            batch.append({"name": name, "step": step, "value": value})
    agent.post("/api/v1/agent/metrics", {"points": batch})


@pytest.fixture
def demo_job(live_console, celery_worker, scripted_agent, people):
    """The demo's scenario played by a scripted agent: explosion, NaN, L3 pause, resume."""
    install_default_pack()
    rng = random.Random(7)
    agent = scripted_agent(name="demo-run")
    manager = people("mona", "vision", Role.MANAGER)
    people("olga", "vision", Role.ONCALL)
    for start in range(1, DIVERGE, 100):
        post(agent, range(start, min(start + 100, DIVERGE)), rng)
    post(agent, range(DIVERGE, INF_GRAD), rng)
    post(agent, [INF_GRAD, NAN], rng)  # the step boundary after the Inf: the NaN is logged too
    command = agent.wait_for_command("checkpoint_and_pause", NAN)
    agent.ack_checkpoint(command, NAN)
    in_thread(resume_job, manager, agent.job_id, reason="schedule fixed, rolled back")
    resume = agent.wait_for_command("resume", NAN)
    agent.post(
        f"/api/v1/agent/commands/{resume['id']}/ack",
        {"status": "succeeded", "result": {"step": NAN}},
    )
    for start in range(NAN + 1, 900, 100):
        post(agent, range(start, min(start + 100, 900)), rng, resumed=True)
    agent.heartbeat(899)
    return agent


# Geometry of one rendered panel, in CSS pixels, from uPlot's own scales.
GEOMETRY = """([key, healthyFrom, healthyTo, explodedFrom]) => {
  const c = BrakelineCharts.state.charts[key], u = c.plot, raw = c.g.raw;
  const col = c.g.meta.findIndex(m => m.kind === "value") + 1;
  const ys = [];
  raw[0].forEach((x, i) => {
    const v = raw[col][i];
    const healthy = x < healthyFrom || x > healthyTo;
    if (healthy && typeof v === "number" && isFinite(v)) ys.push(u.valToPos(v, "y"));
  });
  const yAxis = u.axes[1], ctx = document.createElement("canvas").getContext("2d");
  ctx.font = "12px system-ui, sans-serif";
  const labels = (c.yLabels || []).filter(v => v !== null && v !== "");
  return {
    height: u.bbox.height / devicePixelRatio,
    healthyTop: Math.min(...ys), healthyBottom: Math.max(...ys),
    yMin: u.scales.y.min, yMax: u.scales.y.max, distr: u.scales.y.distr,
    labels: labels, labelWidth: Math.max(0, ...labels.map(t => ctx.measureText(t).width)),
    axisWidth: c.ySize, xLabel: u.axes[0].label, legendX: u.series[0].label,
    seriesLabels: u.series.map(s => s.label), bands: (u.bands || []).length,
    xLabels: (c.xLabels || []).filter(v => v),
  };
}"""


# The review's SVG curve: how much of the plot the healthy points fill, its tick labels and
# the boxes of its marker labels as drawn.
REVIEW_CURVE = """(id) => {
  const svg = document.getElementById(id), top = +svg.dataset.top, bottom = +svg.dataset.bottom;
  const ys = [];
  svg.querySelectorAll("polyline").forEach(p => { for (const pt of p.points) {
    if (pt.y > top + 0.5 && pt.y < bottom - 0.5) ys.push(pt.y); } });
  const box = el => {
    const r = el.getBoundingClientRect();
    return {x: r.x, y: r.y, width: r.width, height: r.height};
  };
  return {
    fill: ys.length ? (Math.max(...ys) - Math.min(...ys)) / (bottom - top) : 0,
    ticks: [...svg.querySelectorAll("text.y-tick")].map(t => t.textContent),
    labels: [...svg.querySelectorAll("text.marker-label")].map(t => [t.textContent, box(t)]),
    visible: svg.getBoundingClientRect().width > 0,
  };
}"""


def assert_review_curve(page, svg_id: str) -> None:
    curve = page.evaluate(REVIEW_CURVE, svg_id)
    assert curve["visible"] and curve["fill"] >= 0.5, curve
    assert_readable(curve["ticks"])
    texts = {text for text, _ in curve["labels"]}
    assert {"alert", "stopped", "resumed"} <= texts, texts
    boxes = [box for _, box in curve["labels"]]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not boxes_overlap(a, b), curve["labels"]


def boxes_overlap(a: dict, b: dict) -> bool:
    return not (
        a["x"] + a["width"] <= b["x"]
        or b["x"] + b["width"] <= a["x"]
        or a["y"] + a["height"] <= b["y"]
        or b["y"] + b["height"] <= a["y"]
    )


def assert_readable(labels: list[str]) -> None:
    assert len(labels) >= 3, labels
    for text in labels:
        assert len(text) <= 7, f"tick label {text!r} is not short"
        assert "," not in text and "000000" not in text


def _legend_and_healthy_view(page, loss) -> None:
    # Hovering: the legend names the step "step" and reads values like the ticks.
    over = loss.locator(".u-over").bounding_box()
    page.mouse.move(over["x"] + over["width"] * 0.3, over["y"] + over["height"] / 2)
    legend = loss.locator(".u-legend .u-series")
    expect(legend.nth(0)).to_contain_text(re.compile(r"step\s*\d+"))
    expect(legend.nth(1)).to_contain_text(re.compile(r"loss\s*0\.\d{1,6}$"))
    # No flat line: the healthy loss (before the explosion and after the resume) fills
    # at least half the plot, and the exploded points are drawn clipped and said so.
    for key in ("loss", "grad"):
        g = page.evaluate(GEOMETRY, [key, DIVERGE, NAN])
        assert (g["healthyBottom"] - g["healthyTop"]) / g["height"] >= 0.5, (key, g)
        assert g["yMax"] < 100, (key, g)
        assert_readable(g["labels"])
        assert g["axisWidth"] >= g["labelWidth"] + 4, f"{key}: y labels clipped {g}"
        assert g["xLabel"] == "step" and g["legendX"] == "step"
    expect(loss.locator(".clip-note")).to_contain_text(
        re.compile(r"above the view, up to \d\.\de33")
    )
    assert int(loss.get_attribute("data-clipped")) >= 40


def _band_and_markers(page, loss) -> None:
    # The band belongs to the loss, although nonfinite.loss shares the panel.
    g = page.evaluate(GEOMETRY, ["loss", DIVERGE, NAN])
    assert g["bands"] == 1 and "loss band +2σ" in g["seriesLabels"], g
    assert "nonfinite.loss (count)" in g["seriesLabels"]
    expect(loss.locator(".band-note")).to_contain_text("mean ± 2")

    # NaN, L3, paused and resumed share (nearly) one step: their labels do not overlap.
    labels = loss.locator(".marker-label")
    texts = labels.all_inner_texts()
    for wanted in ("NaN", "L3", "paused", "resumed", "L1"):
        assert wanted in texts, texts
    boxes = [labels.nth(i).bounding_box() for i in range(labels.count())]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not boxes_overlap(a, b), (texts, boxes)
    loss.screenshot(path=str(SCREENSHOTS / "curves-loss-panel.png"))


def _log_and_full_scales(page, loss) -> None:
    # Log scale shows every decade, up to the explosion.
    page.click('button[data-y="log"]')
    g = page.evaluate(GEOMETRY, ["loss", DIVERGE, NAN])
    assert g["distr"] == 3 and g["yMax"] >= 3e33 and g["yMin"] <= 0.02, g
    assert_readable(g["labels"])
    assert any("e3" in t for t in g["labels"]), g["labels"]
    loss.screenshot(path=str(SCREENSHOTS / "curves-loss-log.png"))
    page.click('button[data-y="all"]')
    g = page.evaluate(GEOMETRY, ["loss", DIVERGE, NAN])
    assert g["distr"] == 1 and g["yMax"] >= 3e33, g
    assert_readable(g["labels"])
    page.click('button[data-y="healthy"]')


def _smoothing(page) -> None:
    # Smoothing: a second, calmer line over the faded raw one.
    page.select_option("#smoothing", "0.9")
    roughness = page.evaluate("""() => {
      const c = BrakelineCharts.state.charts.loss, d = c.plot.data;
      const raw = c.g.meta.findIndex(m => m.kind === "value") + 1;
      const smooth = c.g.meta.findIndex(m => m.kind === "smooth") + 1;
      const rough = col => d[col].slice(600, 890)
        .reduce((s, v, i, a) => i ? s + Math.abs(v - a[i - 1]) : 0, 0);
      return smooth > 0 ? [rough(raw), rough(smooth)] : null;
    }""")
    assert roughness is not None and roughness[1] < roughness[0] / 2, roughness
    page.select_option("#smoothing", "0")


def _overlays(page, loss, earlier) -> None:
    # Overlay: the attempt before the resume, from its start, beside the new attempt.
    page.select_option("#compare", f"resume:{NAN}")
    g = page.evaluate(GEOMETRY, ["loss", DIVERGE, NAN])
    assert "loss · before resume (from its start)" in g["seriesLabels"], g
    overlaid = page.evaluate("""() => {
      const c = BrakelineCharts.state.charts.loss;
      const col = c.g.meta.findIndex(m => m.kind === "overlay") + 1;
      return c.plot.data[col].filter(v => typeof v === "number").length;
    }""")
    assert overlaid > 300
    loss.screenshot(path=str(SCREENSHOTS / "curves-loss-compare.png"))
    page.select_option("#compare", f"job:{earlier.job_id}")
    expect(loss).to_have_attribute("data-overlay", "demo-run-yesterday")
    g = page.evaluate(GEOMETRY, ["loss", DIVERGE, NAN])
    assert "loss · demo-run-yesterday" in g["seriesLabels"], g
    page.select_option("#compare", "")


def _time_axis(page) -> None:
    # Time axis: UTC, labelled, 24-hour clock.
    page.click('button[data-x="time"]')
    g = page.evaluate(GEOMETRY, ["loss", 0, 0])
    assert g["xLabel"] == "time (UTC)" and g["legendX"] == "time (UTC)"
    assert g["xLabels"] and all(":" in t and "m" not in t for t in g["xLabels"]), g
    page.click('button[data-x="step"]')


def test_the_demo_curves_stay_readable_through_the_explosion_nan_pause_and_resume(
    browser, live_console, demo_job, scripted_agent, log_in
):
    earlier = scripted_agent(name="demo-run-yesterday")  # an earlier run of the team to overlay
    earlier.metrics([(s, 0.05 + 1.0 * math.exp(-s / 120)) for s in range(1, 700)])
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        log_in(page, "olga")
        page.goto(f"{live_console}/jobs/{demo_job.job_id}/")
        loss = page.locator('figure[data-group="loss"]')
        expect(loss).to_have_attribute("data-last-step", "899")  # (CSP: no wait_for_function)
        page.evaluate("BrakelineCharts.ready")
        expect(loss.locator(".marker-label", has_text="resumed")).to_be_visible()

        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "curves-desktop.png"), full_page=True)
        _legend_and_healthy_view(page, loss)
        _band_and_markers(page, loss)
        _log_and_full_scales(page, loss)
        _smoothing(page)
        _overlays(page, loss, earlier)
        _time_axis(page)
        # The review's curve of the same incident: the same healthy view, server-side.
        incident = in_thread(lambda: Incident.objects.filter(job_id=demo_job.job_id).first())
        page.goto(f"{live_console}/incidents/{incident.pk}/review/")
        assert_review_curve(page, "curve")
        expect(page.locator("#curve-clipped")).to_contain_text("above the view, up to")
        page.locator("section.curve").screenshot(path=str(SCREENSHOTS / "review-curve.png"))
    finally:
        context.close()


def test_the_curves_and_the_review_chart_fit_a_phone(browser, live_console, demo_job, log_in):
    incident = in_thread(lambda: Incident.objects.filter(job_id=demo_job.job_id).first())
    context = browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True)
    page = context.new_page()
    try:
        log_in(page, "olga")
        page.goto(f"{live_console}/jobs/{demo_job.job_id}/")
        loss = page.locator('figure[data-group="loss"]')
        expect(loss).to_have_attribute("data-last-step", "899")
        page.evaluate("BrakelineCharts.ready")
        expect(loss.locator(".marker-label", has_text="resumed")).to_be_visible()
        g = page.evaluate(GEOMETRY, ["loss", DIVERGE, NAN])
        assert (g["healthyBottom"] - g["healthyTop"]) / g["height"] >= 0.5, g
        assert g["axisWidth"] >= g["labelWidth"] + 4, g
        labels = loss.locator(".marker-label")
        boxes = [labels.nth(i).bounding_box() for i in range(labels.count())]
        for i, a in enumerate(boxes):
            assert a["x"] >= 0 and a["x"] + a["width"] <= PHONE["width"], a
            for b in boxes[i + 1 :]:
                assert not boxes_overlap(a, b), boxes
        assert sideways(page) == 0
        page.screenshot(path=str(SCREENSHOTS / "curves-phone.png"), full_page=True)
        page.locator("#charts").screenshot(path=str(SCREENSHOTS / "curves-phone-charts.png"))

        page.goto(f"{live_console}/incidents/{incident.pk}/review/")
        page.wait_for_selector("#curve-phone")
        assert_review_curve(page, "curve-phone")
        assert sideways(page) == 0
        page.locator("section.curve").screenshot(path=str(SCREENSHOTS / "review-curve-phone.png"))
    finally:
        context.close()


def sideways(page) -> int:
    return page.evaluate(
        "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
        " - document.documentElement.clientWidth"
    )


def test_a_decaying_sawtooth_loss_is_no_climb(
    page, live_console, celery_worker, scripted_agent, people, log_in
):
    """A loss that decays with a sawtooth (four small rises in five steps) until a NaN: the
    rises are no run-up into the NaN, so nothing of it is left out of the view."""
    install_default_pack()
    agent = scripted_agent(name="sawtooth")
    people("olga", "vision", Role.ONCALL)
    agent.metrics([(s, 2.0 + 1.0 / (1 + s / 200) + (s % 5) * 0.004) for s in range(400)])
    agent.metrics([(400, "NaN")])
    log_in(page, "olga")
    page.goto(f"{live_console}/jobs/{agent.job_id}/")
    loss = page.locator('figure[data-group="loss"]')
    expect(loss).to_have_attribute("data-last-step", "400")
    expect(loss.locator(".marker-label", has_text="NaN")).to_be_visible()
    g = page.evaluate(GEOMETRY, ["loss", 400, 400])
    assert (g["healthyBottom"] - g["healthyTop"]) / g["height"] >= 0.8, g
    assert loss.get_attribute("data-clipped") == "0"


JS_CASES = """() => {
  const M = BrakelineChartMath;
  const numbers = [[0.25, 0.05], [1500, 500], [3.5e33, null], [1e33, 5e32], [0.00012, null],
                   [2e6, 1e6], [-0.25, 0.05], ["NaN", null]].map(([v, s]) => M.formatNumber(v, s));
  const items = Array.from({length: 20}, (_, i) => ({x: 100 + (i % 3), width: 50, label: "m" + i}));
  const layout = M.layoutLabels(items, 400, 4, 4);
  const steps = Array.from({length: 400}, (_, s) => s);
  const wiggle = (s) => (s % 5) * 0.004;
  // A schedule's decay at step 200 drops the loss below all it held before, and a deviation
  // alert marks it: the lower loss is learning, every point of it stays in view.
  const dropped = steps.map((s) => (s < 200 ? 2.0 : 1.2) + wiggle(s));
  // An explosion into a NaN at 399: the climb is left out, the range is the healthy one.
  const exploded = steps.map((s) => (s < 380 ? 2.0 + wiggle(s) : s < 399 ? 10 ** (s - 378) : NaN));
  const ranges = [M.healthyRange(steps, dropped, [200]), M.healthyRange(steps, exploded, [399])];
  return {numbers, placed: layout.placed, hidden: layout.hidden.length, ranges};
}"""


def test_the_chart_rules_in_the_browser(page, live_console, people, log_in):
    """chart-math.js as the page loads it: numbers, and labels that find a free place or are
    counted as hidden."""
    people("olga", "vision", Role.ONCALL)
    log_in(page, "olga")
    page.goto(f"{live_console}/")
    page.add_script_tag(url=f"{live_console}/static/console/chart-math.js")
    got = page.evaluate(JS_CASES)
    (dropped, exploded) = got["ranges"]
    assert dropped["min"] == 1.2 and dropped["max"] >= 2.0, dropped
    assert exploded["max"] < 2.1 and exploded["min"] == 2.0, exploded
    assert got["numbers"] == ["0.25", "1.5k", "3.5e33", "1e33", "1.2e-4", "2M", "-0.25", "NaN"]
    placed = got["placed"]
    assert len(placed) + got["hidden"] == 20 and got["hidden"] > 0
    for i, a in enumerate(placed):
        assert a["left"] >= 0 and a["left"] + a["width"] <= 400
        for b in placed[i + 1 :]:
            assert (
                a["row"] != b["row"]
                or a["left"] + a["width"] <= b["left"]
                or (b["left"] + b["width"] <= a["left"])
            ), (a, b)
