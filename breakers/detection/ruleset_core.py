"""Rule sets under version control, the pure part (no Django): parsing a change, applying it,
the canonical snapshot of a rule set, the readable diff between two snapshots, and whether a
version is drilled.

A team's rule set is what its jobs are braked by: the default pack with the team's rows over
it (``breakers.detection.rules.effective_rules``) and the process settings braking depends on
(the executor's grace, the acknowledgement and heartbeat deadlines). ``breakers.detection.
rulesets`` stores one immutable version of it per change; everything here works on plain
dicts so it is tested table-driven in milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from breakers.detection.detectors import DETECTORS
from breakers.detection.engine import ACTIONS, LAYERS, SEVERITIES, RuleSpec
from breakers.recovery.verdict import DEFAULT_BUDGET, HOLD_POLICY, MAX_BUDGET, POLICIES

# The columns of a rule (``breakers.models.Rule.SPEC_FIELDS``), in display order.
RULE_FIELDS: tuple[str, ...] = (
    "key",
    "name",
    "layer",
    "metric",
    "detector",
    "params",
    "severity",
    "action",
    "action_params",
    "per_node",
    "per_metric",
    "enabled",
    "clear_after",
    "clear_after_seconds",
    "runbook",
    "recovery",
    "recovery_budget",
    "shadow",
)
# Fields left out of a snapshot while they hold their default: a rule set that never used
# them keeps the fingerprint it had before they existed (no spurious "outside change").
OMITTED_AT_DEFAULT: Mapping[str, Any] = {
    "shadow": False,
    "recovery": HOLD_POLICY,
    "recovery_budget": DEFAULT_BUDGET,
}
EDITABLE_FIELDS = frozenset(RULE_FIELDS) - {"key"}
REQUIRED_ON_CREATE = ("name", "layer", "metric", "detector")
OPS = ("create", "update", "enable", "disable", "delete")
MAX_CHANGES = 100
KEY_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,99}$")
_TEXT_LIMITS = {"name": 200, "metric": 300, "runbook": 64}
DETECTOR_KINDS: tuple[str, ...] = tuple(sorted(DETECTORS))
_CHOICES = {
    "layer": LAYERS,
    "severity": SEVERITIES,
    "action": ACTIONS,
    "detector": DETECTOR_KINDS,
    "recovery": POLICIES,
}
_MAX_CLEAR_AFTER = 1_000_000
_MAX_SECONDS = 10_000_000.0
_WHOLE_LIMITS = {"clear_after": _MAX_CLEAR_AFTER, "recovery_budget": MAX_BUDGET}
_MAX_JSON_DEPTH = 4
# Rules judged outside the engine, by the control plane's watchdog (detector "watchdog"): in no
# default pack, as they read no series; a team may put one in shadow mode and change nothing
# else of it — its level, action and deadline are the watchdog's (``breakers.control.
# heartbeats.heartbeat_signal``), and disabling it would leave a silent job noticed by nobody.
WATCHDOG_RULES: Mapping[str, Mapping[str, Any]] = {
    "heartbeat-timeout": {  # incidents.heartbeats.HEARTBEAT_RULE_KEY
        "key": "heartbeat-timeout",
        "name": "Heartbeat timeout",
        "layer": "health",
        "metric": "heartbeat",
        "detector": "watchdog",
        "severity": "L3",
        "action": "checkpoint_and_pause",
        "runbook": "hung_no_logs",
    }
}


class ChangeError(ValueError):
    """A change that cannot be made; ``field`` names the input at fault (a 400's field)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class RuleChange:
    op: str
    key: str
    fields: Mapping[str, Any]


# --- Parsing: every input is hostile until it is one of these ------------------------------


def parse_changes(raw: Any) -> list[RuleChange]:
    """The list of changes of a request, checked field by field (ChangeError names the field
    as ``changes[i].fields.<name>``). Types only: whether a change fits the rule set is
    ``apply_changes``'s question."""
    if not isinstance(raw, list) or not raw:
        raise ChangeError("changes must be a non-empty list.", "changes")
    if len(raw) > MAX_CHANGES:
        raise ChangeError(f"At most {MAX_CHANGES} changes at once.", "changes")
    parsed, seen = [], set()
    for index, item in enumerate(raw):
        where = f"changes[{index}]"
        if not isinstance(item, Mapping):
            raise ChangeError("Each change is an object {op, key, fields}.", where)
        unknown = set(item) - {"op", "key", "fields"}
        if unknown:
            raise ChangeError(f"Unknown: {', '.join(sorted(map(str, unknown)))}.", where)
        op = item.get("op")
        if op not in OPS:
            raise ChangeError(f"op must be one of {', '.join(OPS)}.", f"{where}.op")
        key = item.get("key")
        if not isinstance(key, str) or not KEY_PATTERN.match(key):
            raise ChangeError(
                "key must be 1–100 lower-case letters, digits, - or _.", f"{where}.key"
            )
        if key in seen:
            raise ChangeError(f"Rule {key!r} is changed twice in one request.", f"{where}.key")
        seen.add(key)
        fields = item.get("fields", {})
        if not isinstance(fields, Mapping):
            raise ChangeError("fields must be an object.", f"{where}.fields")
        if op in ("enable", "disable", "delete") and fields:
            raise ChangeError(f"{op} takes no fields.", f"{where}.fields")
        parsed.append(RuleChange(op, key, _parse_fields(fields, f"{where}.fields")))
    return parsed


def _parse_fields(fields: Mapping[str, Any], where: str) -> dict[str, Any]:
    clean: dict[str, Any] = {}
    for name, value in fields.items():
        path = f"{where}.{name}"
        if name not in EDITABLE_FIELDS:
            raise ChangeError(f"{name!r} is not a field a change can set.", path)
        clean[name] = _parse_value(name, value, path)
    return clean


def _parse_value(name: str, value: Any, path: str) -> Any:
    if name in _CHOICES:
        if value not in _CHOICES[name]:
            raise ChangeError(f"{name} must be one of {', '.join(_CHOICES[name])}.", path)
    elif name in _TEXT_LIMITS:
        limit = _TEXT_LIMITS[name]
        ok = isinstance(value, str) and "\x00" not in value and len(value) <= limit
        if not ok or (name != "runbook" and not value.strip()):
            raise ChangeError(f"{name} must be text of 1–{limit} characters.", path)
        value = value.strip()
    elif name in ("per_node", "per_metric", "enabled", "shadow"):
        if not isinstance(value, bool):
            raise ChangeError(f"{name} must be true or false.", path)
    elif name in _WHOLE_LIMITS:
        limit = _WHOLE_LIMITS[name]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise ChangeError(f"{name} must be a whole number from 1 to {limit}.", path)
    elif name == "clear_after_seconds":
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or not 0 <= value <= _MAX_SECONDS:
            raise ChangeError(f"clear_after_seconds must be 0 to {_MAX_SECONDS:g}.", path)
        value = float(value)
    else:  # params, action_params
        if not isinstance(value, Mapping):
            raise ChangeError(f"{name} must be an object.", path)
        _check_json(value, path, 1)
        value = dict(value)
    return value


def _check_json(value: Any, path: str, depth: int) -> None:
    """Plain JSON, shallow, no NUL (PostgreSQL's jsonb refuses it), no NaN (strict JSON)."""
    if depth > _MAX_JSON_DEPTH:
        raise ChangeError("nested too deeply.", path)
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str) or "\x00" in key:
                raise ChangeError("keys must be text without NUL.", path)
            _check_json(item, f"{path}.{key}", depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_json(item, path, depth + 1)
    elif isinstance(value, str):
        if "\x00" in value:
            raise ChangeError("text must not contain NUL.", path)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ChangeError("numbers must be finite.", path)
    elif value is not None and not isinstance(value, (bool, int)):
        raise ChangeError("must be plain JSON.", path)


# --- Applying: the team's rows after the changes, every rule validated ----------------------


def apply_changes(
    team_rows: Mapping[str, Mapping[str, Any]],
    defaults: Mapping[str, Mapping[str, Any]],
    changes: Iterable[RuleChange],
) -> dict[str, dict[str, Any]]:
    """The team's rows (key → the rule's fields) once ``changes`` are made; inputs unchanged.

    ``update`` of a default rule the team has no row for creates the team's override (a copy
    of the default with the change); ``params`` and ``action_params`` are replaced as a whole.
    ``delete`` removes the team's row: an override falls back to the default rule, which a
    team cannot delete (disable it). An override changed back to the default's fields is
    dropped, so the team follows the pack's later changes of that rule again. Each rule that
    changed is validated as ``Rule.clean`` does, by building its ``RuleSpec``; the first
    failure raises ChangeError naming the field.
    """
    rows = {key: dict(fields) for key, fields in team_rows.items()}
    for index, change in enumerate(changes):
        where = f"changes[{index}]"
        _check_watchdog_change(change, change.key in rows, where)
        reference = defaults.get(change.key) or WATCHDOG_RULES.get(change.key)
        base = rows.get(change.key) or reference
        if change.op == "create":
            _create(rows, change, base, where)
        elif base is None:
            raise ChangeError(f"There is no rule {change.key!r}.", f"{where}.key")
        elif change.op == "delete":
            if change.key not in rows:
                raise ChangeError(
                    f"{change.key!r} is a default-pack rule: disable it instead.", f"{where}.key"
                )
            del rows[change.key]
        else:
            _update(rows, change, base, reference, where)
    return rows


def _create(
    rows: dict[str, dict[str, Any]],
    change: RuleChange,
    base: Mapping[str, Any] | None,
    where: str,
) -> None:
    """A new rule of the team's own: a key no rule has yet, with every required field."""
    if base is not None:
        raise ChangeError(f"Rule {change.key!r} exists already: update it.", f"{where}.key")
    missing = [name for name in REQUIRED_ON_CREATE if name not in change.fields]
    if missing:
        raise ChangeError(f"A new rule needs {', '.join(missing)}.", f"{where}.fields.{missing[0]}")
    rows[change.key] = _validated({"key": change.key, **change.fields}, where)


def _update(
    rows: dict[str, dict[str, Any]],
    change: RuleChange,
    base: Mapping[str, Any],
    reference: Mapping[str, Any] | None,
    where: str,
) -> None:
    """An update, enable or disable: the team's row, or none when it equals the default."""
    updates: Mapping[str, Any] = change.fields
    if change.op in ("enable", "disable"):
        updates = {"enabled": change.op == "enable"}
    rows[change.key] = _validated({**base, **updates, "key": change.key}, where)
    if reference is not None and rows[change.key] == _validated(reference, where):
        del rows[change.key]  # the same as the default: no override to keep


def _check_watchdog_change(change: RuleChange, has_row: bool, where: str) -> None:
    """Of a watchdog's rule only ``shadow`` changes (see ``WATCHDOG_RULES``); no other rule is
    judged by the watchdog."""
    if change.key not in WATCHDOG_RULES:
        if change.fields.get("detector") == "watchdog":
            raise ChangeError(
                "Only the watchdog's own rules (heartbeat-timeout) are judged by the watchdog.",
                f"{where}.fields.detector",
            )
        return
    if change.op in ("enable", "disable") or (change.op == "delete" and not has_row):
        raise ChangeError(
            f"{change.key!r} is the watchdog's rule: it cannot be disabled or deleted (a silent "
            "job would be noticed by nobody); set shadow to observe it only.",
            f"{where}.op",
        )
    for name in change.fields:
        if name != "shadow":
            raise ChangeError(
                f"Only shadow changes in the watchdog's rule {change.key!r}: its {name} is the "
                "watchdog's.",
                f"{where}.fields.{name}",
            )


def _validated(fields: Mapping[str, Any], where: str) -> dict[str, Any]:
    try:
        return RuleSpec.from_dict(fields).to_dict()
    except (ValueError, TypeError) as error:
        raise ChangeError(str(error), f"{where}.fields.{_field_of(str(error))}") from None


def _field_of(message: str) -> str:
    """Which field an engine message is about: the first field it names, else the detector's
    parameters (``make_config``'s messages name the parameter, not the column)."""
    if "only record" in message:  # a performance-layer rule with a braking action
        return "action"
    names = ("recovery_budget", "recovery", "clear_after_seconds", "clear_after", "metric")
    for name in (*names, "layer", "severity", "action"):
        if re.search(rf"\b{name}\b", message):
            return name
    if message.startswith("unknown detector kind"):
        return "detector"
    return "params"


# --- Snapshots and diffs ---------------------------------------------------------------------


def snapshot(rules: Iterable[Mapping[str, Any]], braking: Mapping[str, Any]) -> dict[str, Any]:
    """The canonical form of a rule set: rules by key (with ``origin``: default, override or
    team), and the braking settings."""
    return {
        "rules": {rule["key"]: _canonical_rule(rule) for rule in rules},
        "braking": {name: braking[name] for name in sorted(braking)},
    }


def _canonical_rule(rule: Mapping[str, Any]) -> dict[str, Any]:
    return {
        name: rule[name]
        for name in sorted(rule)
        if name not in OMITTED_AT_DEFAULT or rule[name] != OMITTED_AT_DEFAULT[name]
    }


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(data: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    """One level of a dict field becomes ``params.k``: a diff says which parameter moved."""
    if isinstance(value, Mapping):
        return {f"{prefix}.{key}": item for key, item in sorted(value.items())} or {prefix: {}}
    return {prefix: value}


def _field_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[dict[str, Any]]:
    flat_old: dict[str, Any] = {}
    flat_new: dict[str, Any] = {}
    for name in sorted(set(old) | set(new)):
        flat_old.update(_flatten(old.get(name), name) if name in old else {})
        flat_new.update(_flatten(new.get(name), name) if name in new else {})
    return [
        {"field": path, "old": flat_old.get(path), "new": flat_new.get(path)}
        for path in sorted(set(flat_old) | set(flat_new))
        if flat_old.get(path) != flat_new.get(path) or (path in flat_old) != (path in flat_new)
    ]


def diff(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What changed from ``old`` to ``new`` (None: the first version), per rule and field."""
    if old is None:
        return [{"kind": "first", "rules": len(new["rules"])}]
    entries: list[dict[str, Any]] = []
    # A field left out at its default reads as that default: "shadow False → True".
    old_rules, new_rules = (
        {key: {**OMITTED_AT_DEFAULT, **rule} for key, rule in snap.get("rules", {}).items()}
        for snap in (old, new)
    )
    for key in sorted(set(old_rules) | set(new_rules)):
        if key not in old_rules:
            entries.append({"kind": "rule", "key": key, "change": "added", "fields": []})
        elif key not in new_rules:
            entries.append({"kind": "rule", "key": key, "change": "removed", "fields": []})
        elif changed := _field_changes(old_rules[key], new_rules[key]):
            entries.append({"kind": "rule", "key": key, "change": "changed", "fields": changed})
    for change in _field_changes(old.get("braking", {}), new.get("braking", {})):
        entries.append({"kind": "setting", **change})
    return entries


def _show(value: Any) -> str:
    return (
        "–"
        if value is None
        else canonical_json(value)
        if isinstance(value, (dict, list))
        else str(value)
    )


def describe(entries: Iterable[Mapping[str, Any]]) -> list[str]:
    """The diff as sentences, one per rule or setting."""
    lines = []
    for entry in entries:
        if entry["kind"] == "first":
            lines.append(f"first recorded version ({entry['rules']} rules)")
        elif entry["kind"] == "setting":
            lines.append(f"setting {entry['field']}: {_show(entry['old'])} → {_show(entry['new'])}")
        elif entry["change"] == "changed":
            moves = "; ".join(
                f"{f['field']} {_show(f['old'])} → {_show(f['new'])}" for f in entry["fields"]
            )
            lines.append(f"{entry['key']}: {moves}")
        else:
            lines.append(f"{entry['key']}: {entry['change']}")
    return lines


def summary(entries: Sequence[Mapping[str, Any]], limit: int = 200) -> str:
    """A short line for "not drilled since <change>"."""
    if not entries:
        return "no change"
    if entries[0]["kind"] == "first":
        return describe(entries)[0]
    names = [e["key"] if e["kind"] == "rule" else f"setting {e['field']}" for e in entries]
    text = ", ".join(dict.fromkeys(names)) + " changed"
    return text if len(text) <= limit else f"{len(names)} rules and settings changed"


def active_rules(snapshot_data: Mapping[str, Any]) -> list[str]:
    return sorted(key for key, rule in snapshot_data["rules"].items() if rule.get("enabled"))


# --- Drilled or not --------------------------------------------------------------------------


@dataclass(frozen=True)
class DrillStatus:
    drilled: bool
    missing_scenarios: list[str]  # scenarios covering an active rule, without a passing drill
    uncovered_rules: list[str]  # active rules no scenario covers (no drill can vouch for them)


def drill_status(
    active: Iterable[str], coverage: Mapping[str, Iterable[str]], passing: set[str]
) -> DrillStatus:
    """A version is drilled when every scenario covering one of its active rules passed a drill
    on that version. With no covering scenario at all nothing vouches for the version: not
    drilled (else an empty coverage table would call every rule set drilled)."""
    active_set = set(active)
    covering = sorted(name for name, rules in coverage.items() if active_set & set(rules))
    covered = {rule for name in covering for rule in coverage[name]}
    missing = [name for name in covering if name not in passing]
    return DrillStatus(
        drilled=bool(covering) and not missing,
        missing_scenarios=missing,
        uncovered_rules=sorted(active_set - covered),
    )


def schedule_period(now_epoch: float, interval_seconds: float) -> int:
    """Which scheduled drill period ``now`` falls in: the key that makes the schedule idempotent
    (the beat may run twice, a worker may retry: one drill set per team and period)."""
    return int(now_epoch // interval_seconds)
