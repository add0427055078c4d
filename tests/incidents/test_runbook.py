"""The default runbook: its content (docs/design.md "The runbook"), the entry chosen per alert,
the phone line."""

from __future__ import annotations

import dataclasses

import pytest

from incidents.alerts.runbook import (
    GENERIC,
    PHONE_LINE_MAX_CHARS,
    RUNBOOK,
    RunbookEntry,
    format_suggestion,
    suggestion_for,
)

SPEC_SYMPTOMS = {
    "loss_divergence",
    "non_finite",
    "hung_no_logs",
    "checkpoint_save_failure",
    "metrics_differ_after_resume",
}
ALL_ENTRIES = [*RUNBOOK.values(), GENERIC]


def test_runbook_has_exactly_the_spec_symptoms() -> None:
    assert set(RUNBOOK) == SPEC_SYMPTOMS
    assert all(key == entry.key for key, entry in RUNBOOK.items())
    assert GENERIC.key not in RUNBOOK


@pytest.mark.parametrize("entry", ALL_ENTRIES, ids=lambda entry: entry.key)
def test_every_entry_is_complete(entry: RunbookEntry) -> None:
    assert entry.title
    for items in (entry.likely_causes, entry.what_to_check, entry.what_to_do):
        assert isinstance(items, tuple)
        assert items
        assert all(isinstance(item, str) and item.strip() for item in items)


# docs/design.md "The runbook", one distinctive phrase per column, so the data cannot drift.
@pytest.mark.parametrize(
    ("key", "cause", "check", "step"),
    [
        (
            "loss_divergence",
            "learning rate too high",
            "the gradient norm",
            "lower the learning rate",
        ),
        ("non_finite", "log(0)", "the normalisation layers", "enable gradient clipping"),
        ("hung_no_logs", "shared memory too small", "the network between nodes", "NCCL"),
        ("checkpoint_save_failure", "storage full", "free space", "delete old checkpoints"),
        ("metrics_differ_after_resume", "data order changed", "snapshot", "fix the random seeds"),
    ],
)
def test_entries_follow_the_spec_appendix(key: str, cause: str, check: str, step: str) -> None:
    entry = RUNBOOK[key]
    assert any(cause in item for item in entry.likely_causes)
    assert any(check in item for item in entry.what_to_check)
    assert any(step in item for item in entry.what_to_do)


@pytest.mark.parametrize(
    ("rule_key_or_detector", "metric", "expected"),
    [
        # NaN / Inf, whether the detector or the metric says so
        ("non_finite", "loss", "non_finite"),
        ("nonfinite", "grad_norm", "non_finite"),
        ("non-finite", "loss", "non_finite"),
        ("loss_nan", "loss", "non_finite"),
        ("threshold", "nan_count", "non_finite"),
        ("threshold", "inf_count", "non_finite"),
        ("default.stability.NaN", "loss", "non_finite"),
        ("sigma_deviation", "grad_inf_count", "non_finite"),
        # drift on a loss or gradient norm: loss divergence
        ("sigma_deviation", "loss", "loss_divergence"),
        ("sliding_window_sigma", "train/loss", "loss_divergence"),
        ("loss_4sigma_10min", "loss", "loss_divergence"),
        ("sustained_deviation", "val_loss", "loss_divergence"),
        ("monotonic_rise", "loss", "loss_divergence"),
        ("threshold", "loss", "loss_divergence"),
        ("sigma_deviation", "grad_norm", "loss_divergence"),
        ("ZScore", "Loss", "loss_divergence"),
        # heartbeat silence, hangs, communication
        ("absence", "heartbeat", "hung_no_logs"),
        ("heartbeat_timeout", "loss", "hung_no_logs"),
        ("metric_silence", "loss", "hung_no_logs"),
        ("threshold", "heartbeat", "hung_no_logs"),
        ("nccl_timeout", "comm_errors", "hung_no_logs"),
        # checkpoints, even when a timeout is involved
        ("checkpoint_save_failed", "checkpoint", "checkpoint_save_failure"),
        ("checkpoint_timeout", "save_seconds", "checkpoint_save_failure"),
        ("threshold", "ckpt_failures", "checkpoint_save_failure"),
        # after a resume
        ("metrics_differ_after_resume", "loss", "metrics_differ_after_resume"),
        ("resume_mismatch", "loss", "metrics_differ_after_resume"),
        # a runbook key chooses its entry directly
        ("checkpoint_save_failure", "whatever", "checkpoint_save_failure"),
        # everything else: generic
        ("sigma_deviation", "throughput", "generic"),
        ("threshold", "gpu_util", "generic"),
        ("node_failure_count", "nodes_lost", "generic"),
        ("gpu_xid", "xid_errors", "generic"),
        ("sigma_deviation", "loss_scale", "generic"),  # loss scaling is not a loss
        ("threshold", "comm_share", "generic"),  # a performance metric, not a hang
        ("threshold", "info_messages", "generic"),  # "info" is not "inf"
        ("brand_new_detector", "loss", "generic"),  # unknown detector: no guess
        ("", "", "generic"),
    ],
)
def test_suggestion_for(rule_key_or_detector: str, metric: str, expected: str) -> None:
    assert suggestion_for(rule_key_or_detector, metric).key == expected


@pytest.mark.parametrize("entry", ALL_ENTRIES, ids=lambda entry: entry.key)
def test_phone_line_shape(entry: RunbookEntry) -> None:
    line = format_suggestion(entry)
    assert line.startswith("Likely: ")
    assert "; check " in line
    assert "; do " in line
    assert "\n" not in line
    assert line.isascii()  # one non-GSM character would shrink an SMS to 70 characters
    assert len(line) <= PHONE_LINE_MAX_CHARS
    assert not line.endswith("...")  # the default entries fit without cutting
    # the most likely cause, the first check and the first step always survive
    for first in (entry.likely_causes[0], entry.what_to_check[0], entry.what_to_do[0]):
        assert first in line


def test_phone_line_keeps_everything_when_it_fits() -> None:
    assert format_suggestion(RUNBOOK["checkpoint_save_failure"]) == (
        "Likely: storage full, permissions or write timeout; "
        "check the storage mount and its free space; "
        "do delete old checkpoints and check the mount options"
    )


def test_phone_line_drops_extra_causes_before_any_step() -> None:
    line = format_suggestion(RUNBOOK["loss_divergence"])
    assert line == (
        "Likely: learning rate too high; "
        "check the most recent data batches and the gradient norm; "
        "do roll back to the last checkpoint and lower the learning rate"
    )


ONE_ITEM_EACH = RunbookEntry("x", "X", ("a",), ("b",), ("c",))
MANY = RunbookEntry("y", "Y", ("c1", "c2", "c3"), ("k1", "k2"), ("d1", "d2"))


@pytest.mark.parametrize(
    ("entry", "max_chars", "expected"),
    [
        (ONE_ITEM_EACH, 160, "Likely: a; check b; do c"),
        (MANY, 160, "Likely: c1, c2 or c3; check k1 and k2; do d1 and d2"),
        (MANY, 50, "Likely: c1; check k1 and k2; do d1 and d2"),
        (MANY, 40, "Likely: c1; check k1; do d1 and d2"),
        (MANY, 30, "Likely: c1; check k1; do d1"),
        (MANY, 20, "Likely: c1; check..."),
    ],
)
def test_phone_line_shortens_step_by_step(
    entry: RunbookEntry, max_chars: int, expected: str
) -> None:
    line = format_suggestion(entry, max_chars=max_chars)
    assert line == expected
    assert len(line) <= max_chars


def test_entries_are_read_only() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        GENERIC.title = "changed"  # type: ignore[misc]
    with pytest.raises(TypeError):
        RUNBOOK["generic"] = GENERIC  # type: ignore[index]


def test_to_dict_is_json_ready() -> None:
    assert RUNBOOK["non_finite"].to_dict() == {
        "key": "non_finite",
        "title": "NaN / Inf appears",
        "likely_causes": ["numeric overflow", "division by zero", "log(0)"],
        "what_to_check": ["the loss function", "the normalisation layers"],
        "what_to_do": ["enable gradient clipping", "check the data's value ranges"],
    }
