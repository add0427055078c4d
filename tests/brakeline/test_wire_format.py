"""Encoding of points, Retry-After parsing, backoff with jitter."""

import email.utils
import json
import math
import random

import pytest

from brakeline._backoff import Backoff
from brakeline._encoding import (
    LogRecord,
    RecordExpander,
    encode_point,
    format_time,
    json_value,
    to_jsonable,
)
from brakeline._transport import encode_json, parse_retry_after


def test_non_finite_values_become_the_protocol_strings():
    assert json_value(float("nan")) == "NaN"
    assert json_value(float("inf")) == "Infinity"
    assert json_value(float("-inf")) == "-Infinity"
    assert json_value(2.5) == 2.5


def test_expanded_points_are_strict_json_and_keep_nan():
    expander = RecordExpander(node="node-07")
    record = LogRecord(
        step=120,
        time=1767225600.0,
        metrics={"loss": float("nan"), "grad_norm": 3, "lr": float("inf")},
    )
    points = [json.loads(line) for line in expander.expand(record)]
    by_name = {point["name"]: point for point in points}
    assert by_name["loss"] == {
        "name": "loss",
        "step": 120,
        "value": "NaN",
        "time": "2026-01-01T00:00:00.000000Z",
        "node": "node-07",
    }
    assert by_name["grad_norm"]["value"] == 3.0
    assert by_name["lr"]["value"] == "Infinity"
    # A logged loss always carries its non-finite count, even without a torch counter.
    assert by_name["nonfinite.loss"]["value"] == 1.0


def test_the_fast_encoder_writes_exactly_what_json_dumps_writes():
    names = ["loss", 'quote"d', "back\\slash", "ünïcode/λ", "tab\tname", "x" * 200]
    values = [
        0.0,
        -0.0,
        1.0,
        -2.5,
        1e-300,
        1.7976931348623157e308,
        5e-324,
        0.1,
        123456789.0,
        float("nan"),
        float("inf"),
        float("-inf"),
        3,
    ]
    expander = RecordExpander(node='node "7"')
    for step, value in enumerate(values):
        record = LogRecord(
            step=step, time=1767225600.25 + step, metrics={name: value for name in names}
        )
        lines = expander.expand(record)
        time = format_time(record.time)
        expected = [encode_point(name, step, float(value), time, 'node "7"') for name in names]
        assert lines[: len(names)] == expected


def test_finite_losses_report_zero_and_unknown_values_are_skipped():
    expander = RecordExpander(node="n")
    record = LogRecord(step=1, time=0.0, metrics={"train/loss": 0.5, "note": "text"})
    points = [json.loads(line) for line in expander.expand(record)]
    values = {point["name"]: point["value"] for point in points}
    assert values == {"train/loss": 0.5, "nonfinite.loss": 0.0}


def test_observed_loss_counts_win_over_the_logged_value():
    # The HF Trainer logs a finite average in place of a NaN loss; the forward hook saw the NaN.
    record = LogRecord(
        step=5,
        time=0.0,
        metrics={"loss": 1.25},
        loss_nonfinite=2,
        loss_observed=4,
        grad_nonfinite=7,
    )
    values = {
        json.loads(p)["name"]: json.loads(p)["value"] for p in RecordExpander("n").expand(record)
    }
    assert values["nonfinite.loss"] == 2.0
    assert values["nonfinite.grad"] == 7.0


def test_encode_json_refuses_bare_nan_and_to_jsonable_fixes_it():
    with pytest.raises(ValueError):
        encode_json({"value": math.nan})
    assert json.loads(encode_json(to_jsonable({"value": math.nan, "t": (1, 2.0)}))) == {
        "value": "NaN",
        "t": [1, 2.0],
    }


def test_format_time_is_utc_with_z():
    assert format_time(0.5) == "1970-01-01T00:00:00.500000Z"


def test_retry_after_seconds_and_http_date():
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    now = 1_767_225_600.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(30, abs=1)


def test_backoff_grows_exponentially_within_jitter_bounds_and_caps():
    backoff = Backoff(base=0.5, cap=8.0, rng=random.Random(1))
    delays = [backoff.next_delay() for _ in range(10)]
    for attempt, delay in enumerate(delays):
        ceiling = min(8.0, 0.5 * 2**attempt)
        assert ceiling / 2 <= delay <= ceiling
    assert max(delays) <= 8.0
    backoff.reset()
    assert backoff.next_delay() <= 0.5


def test_backoff_jitter_spreads_retries():
    delays = {round(Backoff(1.0, 60.0).next_delay(), 6) for _ in range(50)}
    assert len(delays) > 40


def test_backoff_honours_a_longer_retry_after_but_caps_it():
    backoff = Backoff(base=0.5, cap=8.0)
    assert backoff.next_delay(retry_after=20.0) == 20.0
    assert backoff.next_delay(retry_after=10_000.0, max_retry_after=300.0) == 300.0


def test_backoff_does_not_touch_the_global_random_state():
    random.seed(3)
    expected = random.random()
    random.seed(3)
    Backoff().next_delay()
    assert random.random() == expected


def test_points_the_console_would_refuse_are_skipped_so_the_batch_survives(caplog):
    expander = RecordExpander(node="n")
    assert expander.expand(LogRecord(step=-1, time=0.0, metrics={"loss": 1.0})) == []
    assert expander.expand(LogRecord(step="x", time=0.0, metrics={"loss": 1.0})) == []
    record = LogRecord(step=3, time=0.0, metrics={"": 1.0, "x" * 201: 2.0, "acc": 0.5})
    assert [json.loads(p)["name"] for p in expander.expand(record)] == ["acc"]
    assert "skipped" in caplog.text
