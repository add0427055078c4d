"""Notification routing and content: the pure cores (no Django), table-tested.

Routing follows docs/design.md "Metric layers": health → phone + SMS; stability → chat, from L3 also
phone; performance → the daily digest, never a phone. A team's policy is a list of rules
(layer, lowest level, channels); the channels of every matching rule are joined.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from core.text import fit

# Delivery.first_line's column (incidents/models/notifications.py).
FIRST_LINE_LENGTH = 300

CHANNELS = ("chat", "email", "sms", "phone")
DIGEST = "digest"  # not a channel that pages anyone: the daily e-mail summary
LAYERS = ("health", "stability", "performance")
LEVELS = ("L1", "L2", "L3", "L4")
PAGING_LEVELS = ("L3", "L4")  # at least two channels, one of them phone (docs/design.md)

DEFAULT_RULES: list[dict[str, Any]] = [
    {"layer": "health", "min_level": "L1", "channels": ["phone", "sms"]},
    {"layer": "stability", "min_level": "L1", "channels": ["chat"]},
    {"layer": "stability", "min_level": "L3", "channels": ["phone"]},
    {"layer": "performance", "min_level": "L1", "channels": [DIGEST]},
]


class PolicyError(ValueError):
    """A policy the console refuses; the message says what to change."""


def channels_for(rules: list[dict[str, Any]], layer: str, level: str) -> list[str]:
    """The channels (in CHANNELS order, DIGEST last) an alert of ``layer``/``level`` goes to."""
    chosen: set[str] = set()
    for rule in rules:
        if rule["layer"] == layer and rule["min_level"] <= level:  # "L1" < "L2" < …
            chosen.update(rule["channels"])
    if layer == "performance":
        return [DIGEST] if chosen else []  # never anyone's phone, whatever a rule says
    return [c for c in (*CHANNELS, DIGEST) if c in chosen]


def validate_rules(rules: Any) -> list[dict[str, Any]]:
    """The rules, normalised; PolicyError with a clear message when they break the paging rules
    of docs/design.md "Notifications and paging"."""
    if not isinstance(rules, list) or not rules:
        raise PolicyError("A policy needs a non-empty list of rules.")
    clean = [_clean_rule(index, rule) for index, rule in enumerate(rules)]
    for layer in ("health", "stability"):
        for level in PAGING_LEVELS:
            routed = [c for c in channels_for(clean, layer, level) if c != DIGEST]
            if len(routed) < 2 or "phone" not in routed:
                got = ", ".join(routed) or "nothing"
                raise PolicyError(
                    f"{level} {layer} alerts must go to at least two channels, one of them "
                    f"phone; this policy sends them to {got}."
                )
    return clean


def _clean_rule(index: int, rule: Any) -> dict[str, Any]:
    where = f"rule {index + 1}"
    if not isinstance(rule, dict):
        raise PolicyError(f"{where} must be an object with layer, min_level and channels.")
    layer, level, channels = rule.get("layer"), rule.get("min_level", "L1"), rule.get("channels")
    if layer not in LAYERS:
        raise PolicyError(f"{where}: layer must be one of {', '.join(LAYERS)}, not {layer!r}.")
    if level not in LEVELS:
        raise PolicyError(f"{where}: min_level must be one of {', '.join(LEVELS)}.")
    allowed = (*CHANNELS, DIGEST)
    if not isinstance(channels, list) or not channels or any(c not in allowed for c in channels):
        raise PolicyError(f"{where}: channels must be a non-empty list of {', '.join(allowed)}.")
    if layer == "performance" and set(channels) & {"phone", "sms"}:
        raise PolicyError(
            f"{where}: performance findings go to the daily digest, never to a phone."
        )
    return {"layer": layer, "min_level": level, "channels": list(dict.fromkeys(channels))}


def backoff_seconds(attempt: int, *, base: float = 2.0, cap: float = 300.0) -> float:
    """Delay before retry number ``attempt`` (1, 2, …): base, 2·base, 4·base, … up to cap."""
    return min(cap, base * 2 ** max(0, attempt - 1))


# --- Content ---------------------------------------------------------------------------------

_TAKEN = {
    "checkpoint_and_pause": "paused",
    "terminate": "terminated",
    "lower_lr": "learning rate lowered",
    "pause_data": "data loading paused",
    "isolate_node": "node isolated",
    "inject_fault": "fault injected (drill)",
    "resume": "resumed",
}


@dataclass(frozen=True)
class AlertFacts:
    """What docs/design.md "What an alert must carry" lists, as plain values."""

    level: str
    team: str
    job_id: int
    job_name: str
    metric: str
    value: float
    threshold: float | None
    step: int
    duration_seconds: float
    duration_steps: int
    node: str
    action: str
    runbook_suggestion: str
    link: str
    # The system's own brake for this alert, refused ("No automatic pause: job 'x' is already
    # finished."): then the page says so instead of the action the rule would take.
    refused: str = ""


@dataclass(frozen=True)
class Message:
    first_line: str  # what a phone lock screen shows
    body: str  # every fact, one per line

    def sms(self, limit: int = 480) -> str:
        text = self.first_line + "\n" + "\n".join(self.body.splitlines()[-2:])
        return text if len(text) <= limit else text[: limit - 1] + "…"


def number(value: float | None) -> str:
    if value is None:
        return "none"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return f"{value:.6g}"


def duration_text(seconds: float, steps: int) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{hours}h {minutes}m" if hours else (f"{minutes}m {secs}s" if minutes else f"{secs}s")
    return f"{text} ({steps} steps)" if steps else text


def action_text(level: str, action: str) -> str:
    """L2-L4 actions are issued at once by the system (taken); an L1's is only proposed."""
    if action in ("none", "record", ""):
        return "no action taken"
    if level >= "L2" and action in _TAKEN:
        return _TAKEN[action]
    return f"proposed: {action}"


def _outcome(facts: AlertFacts) -> str:
    """What the system did: never "paused" for a pause it was refused."""
    if facts.refused:
        return facts.refused[:1].lower() + facts.refused[1:]
    return action_text(facts.level, facts.action)


def what_happened(facts: AlertFacts) -> str:
    if not math.isfinite(facts.value):
        what = f"{facts.metric} is {number(facts.value)}"
    elif facts.threshold is not None:
        what = f"{facts.metric} {number(facts.value)} past {number(facts.threshold)}"
    else:
        what = f"{facts.metric} = {number(facts.value)}"
    return what + (f" on {facts.node}" if facts.node else "")


def render(facts: AlertFacts) -> Message:
    first = (
        f"{facts.level} {facts.team}/{facts.job_name}: {what_happened(facts)} at step "
        f"{facts.step} — {_outcome(facts)}"
    )
    lines = [
        f"Level: {facts.level}",
        f"Metric: {facts.metric}",
        f"Value: {number(facts.value)}",
        f"Threshold: {number(facts.threshold)}",
        f"Lasting: {duration_text(facts.duration_seconds, facts.duration_steps)}",
        f"Job: #{facts.job_id} {facts.team}/{facts.job_name}",
        f"Node: {facts.node or 'all nodes'}",
        f"Action: {action_text(facts.level, facts.action)}",
        f"Next step: {facts.runbook_suggestion}",
        f"Open: {facts.link}",
    ]
    return Message(first_line=fit(first, FIRST_LINE_LENGTH), body="\n".join(lines))
