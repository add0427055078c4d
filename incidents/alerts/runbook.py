"""The default runbook as data, and the choice of entry for an alert.

docs/design.md "What an alert must carry": every alert carries a suggested next step from the
runbook (symptom -> likely causes -> what to check -> what to do). The five entries below are
the default runbook of docs/design.md "The runbook"; ``GENERIC`` covers every other alert.

Pure Python on purpose (no Django import): the breaker engine, the notifiers and the UI all
call ``suggestion_for`` / ``format_suggestion``, and the tests run in milliseconds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

# SMS length: the one-line suggestion must survive the phone/SMS channel uncut.
PHONE_LINE_MAX_CHARS = 160


@dataclass(frozen=True)
class RunbookEntry:
    """One symptom of the runbook. Lists are tuples so that an entry can never be edited."""

    key: str
    title: str
    likely_causes: tuple[str, ...]
    what_to_check: tuple[str, ...]
    what_to_do: tuple[str, ...]
    # Where the console shows what to check: a page of the alert's job, relative to
    # /jobs/<id>/ ("" when there is none), and its label.
    link: str = ""
    link_label: str = ""

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form, for alert payloads and the API."""
        entry: dict[str, object] = {
            "key": self.key,
            "title": self.title,
            "likely_causes": list(self.likely_causes),
            "what_to_check": list(self.what_to_check),
            "what_to_do": list(self.what_to_do),
        }
        if self.link:
            entry.update(link=self.link, link_label=self.link_label)
        return entry


LOSS_DIVERGENCE = RunbookEntry(
    key="loss_divergence",
    title="Loss suddenly diverges",
    likely_causes=("learning rate too high", "bad data", "exploding gradients"),
    what_to_check=("the most recent data batches", "the gradient norm"),
    what_to_do=("roll back to the last checkpoint", "lower the learning rate"),
)
NON_FINITE = RunbookEntry(
    key="non_finite",
    title="NaN / Inf appears",
    likely_causes=("numeric overflow", "division by zero", "log(0)"),
    what_to_check=("the loss function", "the normalisation layers"),
    what_to_do=("enable gradient clipping", "check the data's value ranges"),
)
HUNG_NO_LOGS = RunbookEntry(
    key="hung_no_logs",
    title="Training hangs with no logs",
    likely_causes=("communication deadlock", "shared memory too small", "storage I/O blocked"),
    what_to_check=("the network between nodes", "the shared-memory settings"),
    what_to_do=("raise the shared-memory size", "check the NCCL configuration"),
)
CHECKPOINT_SAVE_FAILURE = RunbookEntry(
    key="checkpoint_save_failure",
    title="Checkpoint save fails",
    likely_causes=("storage full", "permissions", "write timeout"),
    what_to_check=("the storage mount", "its free space"),
    what_to_do=("delete old checkpoints", "check the mount options"),
)
METRICS_DIFFER_AFTER_RESUME = RunbookEntry(
    key="metrics_differ_after_resume",
    title="Metrics differ after resume",
    likely_causes=("random seeds not fixed", "data order changed"),
    what_to_check=("the environment snapshot diff across the resume",),
    what_to_do=("fix the random seeds", "restore the data-loader state"),
    link="snapshots/?diff=resume",
    link_label="the snapshot diff across the resume",
)
# For every alert the five symptoms do not cover: where to look first, and a safe default.
GENERIC = RunbookEntry(
    key="generic",
    title="Unusual metric behaviour",
    likely_causes=("a recent change in data, code, configuration or hardware",),
    what_to_check=("the curve around the first anomalous point", "the snapshot diff"),
    what_to_do=("pause the job if it keeps getting worse",),
)

RUNBOOK: Mapping[str, RunbookEntry] = MappingProxyType(
    {
        entry.key: entry
        for entry in (
            LOSS_DIVERGENCE,
            NON_FINITE,
            HUNG_NO_LOGS,
            CHECKPOINT_SAVE_FAILURE,
            METRICS_DIFFER_AFTER_RESUME,
        )
    }
)

# Words that name a symptom outright, checked in this order (the first match wins, so a
# "checkpoint_timeout" is a checkpoint problem before it is a hang).
_NON_FINITE_WORDS = frozenset(
    {"nan", "nans", "inf", "infs", "infinity", "infinite", "finite", "nonfinite", "isnan", "isinf"}
)
_CHECKPOINT_WORDS = frozenset({"checkpoint", "checkpoints", "checkpointing", "ckpt"})
_RESUME_WORDS = frozenset({"resume", "resumed", "resumption", "reproducibility"})
_HUNG_WORDS = frozenset(
    {
        "heartbeat",
        "heartbeats",
        "absence",
        "absent",
        "silence",
        "silent",
        "hang",
        "hung",
        "hangs",
        "stall",
        "stalled",
        "stuck",
        "deadlock",
        "timeout",
        "nccl",
        "communication",
    }
)
_RULE_SYMPTOMS: tuple[tuple[frozenset[str], RunbookEntry], ...] = (
    (_NON_FINITE_WORDS, NON_FINITE),
    (_CHECKPOINT_WORDS, CHECKPOINT_SAVE_FAILURE),
    (_RESUME_WORDS, METRICS_DIFFER_AFTER_RESUME),
    (_HUNG_WORDS, HUNG_NO_LOGS),
)
# A metric's own name is weaker evidence: only words that cannot mean anything else count
# ("timeout" or "communication" in a performance metric such as comm_share must not page
# anyone about a hang).
_METRIC_SYMPTOMS: tuple[tuple[frozenset[str], RunbookEntry], ...] = (
    (_NON_FINITE_WORDS, NON_FINITE),
    (_CHECKPOINT_WORDS, CHECKPOINT_SAVE_FAILURE),
    (frozenset({"heartbeat", "heartbeats"}), HUNG_NO_LOGS),
)
# Detectors that see a value drifting away (sigma deviation, sustained, monotonic rise, plain
# threshold): on a loss or gradient norm, that is the loss-divergence symptom.
_DEVIATION_WORDS = frozenset(
    {
        "sigma",
        "stddev",
        "std",
        "zscore",
        "deviation",
        "deviates",
        "sliding",
        "sustained",
        "monotonic",
        "rise",
        "rising",
        "increase",
        "increasing",
        "spike",
        "divergence",
        "diverge",
        "diverges",
        "diverging",
        "threshold",
        "above",
    }
)
_GRADIENT_WORDS = frozenset({"grad", "grads", "gradient", "gradients", "gradnorm"})
# "loss_scale" (mixed-precision loss scaling) is not a loss: its drift is no divergence.
_NOT_A_LOSS_WORDS = frozenset({"scale", "scaler", "scaling"})


def suggestion_for(rule_key_or_detector: str, metric: str) -> RunbookEntry:
    """The runbook entry for an alert raised by a rule (or detector) on ``metric``.

    Names are read as words (split on anything that is not a letter, case-insensitive), so
    ``"loss_4sigma_10min"``, ``"heartbeat.absence"`` and ``"train/loss"`` all work. A runbook
    key given as the rule key selects that entry directly. Anything unrecognised gets
    ``GENERIC``, never an error: an alert must always carry a suggestion.
    """
    if rule_key_or_detector in RUNBOOK:
        return RUNBOOK[rule_key_or_detector]
    rule_words = _words(rule_key_or_detector)
    metric_words = _words(metric)
    entry = _first_symptom(rule_words, _RULE_SYMPTOMS) or _first_symptom(
        metric_words, _METRIC_SYMPTOMS
    )
    if entry is not None:
        return entry
    if rule_words & _DEVIATION_WORDS and _is_loss_signal(rule_words | metric_words):
        return LOSS_DIVERGENCE
    return GENERIC


def format_suggestion(entry: RunbookEntry, max_chars: int = PHONE_LINE_MAX_CHARS) -> str:
    """One short ASCII line for a phone: ``"Likely: …; check …; do …"``.

    When the full line is longer than ``max_chars``, the extra causes go first, then the
    extra checks; what to do is kept whole as long as possible because it is what the
    reader acts on. As a last resort the line is cut with "...". ASCII only, because one
    non-GSM character turns a 160-character SMS into a 70-character one.
    """
    causes, checks, steps = entry.likely_causes, entry.what_to_check, entry.what_to_do
    for line in (
        _suggestion_line(causes, checks, steps),
        _suggestion_line(causes[:1], checks, steps),
        _suggestion_line(causes[:1], checks[:1], steps),
        _suggestion_line(causes[:1], checks[:1], steps[:1]),
    ):
        if len(line) <= max_chars:
            return line
    return line[: max_chars - 3].rstrip() + "..."


def _suggestion_line(
    causes: tuple[str, ...], checks: tuple[str, ...], steps: tuple[str, ...]
) -> str:
    return (
        f"Likely: {_join(causes, ' or ')}; check {_join(checks, ' and ')}; "
        f"do {_join(steps, ' and ')}"
    )


def _join(items: tuple[str, ...], before_last: str) -> str:
    """("a", "b", "c") with " or " -> "a, b or c"."""
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + before_last + items[-1]


def _words(name: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z]+", name.lower()))


def _first_symptom(
    words: frozenset[str], table: tuple[tuple[frozenset[str], RunbookEntry], ...]
) -> RunbookEntry | None:
    return next((entry for vocabulary, entry in table if words & vocabulary), None)


def _is_loss_signal(words: frozenset[str]) -> bool:
    """A loss (not its mixed-precision scale) or a gradient norm: exploding gradients come first."""
    if words & _GRADIENT_WORDS:
        return True
    return "loss" in words and not words & _NOT_A_LOSS_WORDS
