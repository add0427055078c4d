"""What NVIDIA DCGM's signals mean for a training job — pure Python, no Django.

One table for every front door: the Alertmanager receiver classifies an alert with it, the
agent protocol's rule pack is built from it (a process may push the same metric names), and
``deploy/monitoring/dcgm-rules.yml`` is checked against it by the tests.

Semantics that matter (dcgm-exporter's conventions):
* ``DCGM_FI_DEV_XID_ERRORS`` is a gauge holding the *last* XID the driver reported, not a count.
  An error is a *change* of its value; the same value scraped again is no new error.
* ``…_TOTAL`` fields and the remapped-row counts are counters: an error is a *rise*. A drop is a
  reset (driver reload, exporter restart): it becomes the new baseline, never an alert.
* ``DCGM_FI_DEV_ROW_REMAP_FAILURE`` is a flag: non-zero means the GPU ran out of spare rows.
* Temperature is health (the GPU throttles, then faults); power is performance (recorded).

The XID levels follow NVIDIA's own guidance (see ``XID_SOURCES``): an XID whose resolution is
"reset the GPU / reboot the node / contact support" stops the job and isolates its node (L4);
one that is the application's own fault or is recovered by the driver is a warning or notice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

L1, L2, L3, L4 = "L1", "L2", "L3", "L4"
HEALTH, PERFORMANCE = "health", "performance"

XID_SOURCES = (
    "NVIDIA, Xid Errors, https://docs.nvidia.com/deploy/xid-errors/",
    "NVIDIA, Xid Catalog (resolution buckets), "
    "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html",
    "NVIDIA, GPU Memory Error Management (row remapping, contained/uncontained ECC), "
    "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/",
)


@dataclass(frozen=True)
class Xid:
    code: int
    level: str
    meaning: str


# Fatal for the job and the node: the GPU must be reset, the node rebooted or the part replaced.
# The rest are a warning (L2: usually the application's fault, the GPU keeps working) or a
# notice (L1: the driver recovered). An XID missing from the table is a warning: unknown
# hardware news is worth a page, not a terminated run.
XID_TABLE: dict[int, Xid] = {
    x.code: x
    for x in (
        Xid(13, L2, "Graphics engine exception (usually the application: bad address, kernel)"),
        Xid(31, L2, "GPU memory page fault (usually an illegal address in the application)"),
        Xid(43, L2, "GPU stopped processing; the failing context was reset"),
        Xid(45, L1, "Preemptive cleanup after an earlier error or a killed process"),
        Xid(48, L4, "Double-bit ECC error: uncorrectable memory error"),
        Xid(61, L3, "Internal micro-controller breakpoint/warning"),
        Xid(62, L4, "Internal micro-controller halt"),
        Xid(63, L4, "Row-remapping (page retirement) event: reset the GPU to apply it"),
        Xid(64, L4, "Row-remapping (page retirement) failure"),
        Xid(69, L2, "Graphics engine class error"),
        Xid(74, L4, "NVLink error"),
        Xid(79, L4, "GPU has fallen off the bus"),
        Xid(92, L2, "High single-bit ECC error rate"),
        Xid(94, L4, "Contained ECC error: the affected processes must restart, reset the GPU"),
        Xid(95, L4, "Uncontained ECC error: every process on the GPU is affected, reset it"),
        Xid(119, L4, "GSP RPC timeout: the GPU's system processor stopped answering"),
        Xid(120, L4, "GSP error"),
        Xid(140, L4, "Unrecovered ECC error"),
    )
}
FATAL_XIDS: tuple[int, ...] = tuple(sorted(c for c, x in XID_TABLE.items() if x.level == L4))
UNKNOWN_XID_LEVEL = L2


def xid_level(code: float) -> str | None:
    """The level of an XID value; None for 0 (no error yet) and values that are no XID."""
    if not math.isfinite(code) or code <= 0 or code != int(code):
        return None
    entry = XID_TABLE.get(int(code))
    return entry.level if entry is not None else UNKNOWN_XID_LEVEL


def xid_meaning(code: float) -> str:
    entry = XID_TABLE.get(int(code)) if math.isfinite(code) else None
    return entry.meaning if entry is not None else "XID not in Brakeline's table"


# How a series is read. LAST_VALUE: a change to a new non-zero value is an event; COUNTER: a
# rise is an event; ABOVE: a value above the threshold is a condition (clears below it).
LAST_VALUE, COUNTER, ABOVE = "last_value", "counter", "above"


@dataclass(frozen=True)
class Signal:
    """One DCGM field and what it means. ``key`` names it in alerts (``brakeline_signal``)."""

    key: str
    metric: str
    reading: str
    level: str
    layer: str
    name: str
    threshold: float | None = None
    runbook: str = "hardware-error"


SIGNALS: tuple[Signal, ...] = (
    Signal("dcgm-xid", "DCGM_FI_DEV_XID_ERRORS", LAST_VALUE, L4, HEALTH, "GPU XID error"),
    Signal(
        "dcgm-ecc-dbe",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        COUNTER,
        L4,
        HEALTH,
        "GPU double-bit ECC errors rising",
    ),
    Signal(
        "dcgm-row-remap-failure",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        ABOVE,
        L4,
        HEALTH,
        "GPU row remapping failed (no spare rows left)",
        threshold=0.0,
    ),
    Signal(
        "dcgm-uncorrectable-remapped-rows",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        COUNTER,
        L3,
        HEALTH,
        "GPU rows remapped after uncorrectable errors",
    ),
    Signal(
        "dcgm-nvlink-errors",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        COUNTER,
        L2,
        HEALTH,
        "NVLink CRC errors rising",
        runbook="hung-job",
    ),
    Signal(
        "dcgm-nvlink-replay",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        COUNTER,
        L2,
        HEALTH,
        "NVLink replay errors rising",
        runbook="hung-job",
    ),
    Signal(
        "dcgm-nvlink-recovery",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        COUNTER,
        L3,
        HEALTH,
        "NVLink recovery errors rising",
        runbook="hung-job",
    ),
    Signal(
        "dcgm-pcie-replay",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        COUNTER,
        L1,
        HEALTH,
        "PCIe replays rising",
    ),
    Signal(
        "dcgm-gpu-temperature",
        "DCGM_FI_DEV_GPU_TEMP",
        ABOVE,
        L2,
        HEALTH,
        "GPU temperature above 87 °C",
        threshold=87.0,
    ),
    Signal(
        "dcgm-power",
        "DCGM_FI_DEV_POWER_USAGE",
        ABOVE,
        L1,
        PERFORMANCE,
        "GPU power draw above 700 W",
        threshold=700.0,
    ),
)
SIGNALS_BY_KEY: dict[str, Signal] = {s.key: s for s in SIGNALS}
SIGNALS_BY_METRIC: dict[str, Signal] = {s.metric: s for s in SIGNALS}

# What the system does at each level when the alert comes from outside the job: no soft
# mitigation (lowering the learning rate does not cure a GPU); the health brakes otherwise.
ACTION_FOR_LEVEL = {L1: "none", L2: "none", L3: "checkpoint_and_pause", L4: "terminate_and_isolate"}
LEVELS = (L1, L2, L3, L4)
# Alertmanager's conventional severity label, when no Brakeline label says more. Never above
# L2: only an alert that names its Brakeline level or DCGM signal may stop a job.
SEVERITY_LABELS = {"critical": L2, "error": L2, "page": L2, "warning": L1, "info": L1}


@dataclass(frozen=True)
class Classification:
    """An outside alert in Brakeline's terms."""

    rule_key: str
    rule_name: str
    level: str
    layer: str
    metric: str
    action: str
    runbook: str
    why: str  # which label decided the level, for the timeline


def classify(alertname: str, labels: Mapping[str, str], value: float) -> Classification:
    """Level, layer and action of an outside alert, from its labels (all strings).

    Order: ``brakeline_level`` (the rule's author said so) → ``brakeline_signal`` or the
    alert's ``__name__``-less DCGM metric (the table; for XIDs, the ``xid`` label or the
    value) → Alertmanager's ``severity`` label → L1."""
    signal = SIGNALS_BY_KEY.get(labels.get("brakeline_signal", ""))
    rule_key = f"alertmanager:{alertname}"
    layer = labels.get("brakeline_layer") or (signal.layer if signal else HEALTH)
    if layer not in (HEALTH, PERFORMANCE, "stability"):
        layer = HEALTH
    metric = signal.metric if signal else alertname
    runbook = signal.runbook if signal else "hardware-error"
    name = labels.get("brakeline_name") or (signal.name if signal else alertname)
    level, why = _level(labels, signal, value)
    action = "record" if layer == PERFORMANCE else ACTION_FOR_LEVEL[level]
    return Classification(rule_key, name, level, layer, metric, action, runbook, why)


def rule_of(labels: Mapping[str, str], level: str) -> str | None:
    """The key of the rule-pack rule (``agent_rules``) that reads the same DCGM signal as an
    outside alert, or None when the alert names no signal: one rule per signal, whichever
    door its data came in by, so the rule's shadow mode governs both."""
    signal = SIGNALS_BY_KEY.get(labels.get("brakeline_signal", ""))
    if signal is None:
        return None
    if signal.reading == LAST_VALUE:
        return "dcgm-xid-fatal" if level == L4 else "dcgm-xid"
    return signal.key


def _level(labels: Mapping[str, str], signal: Signal | None, value: float) -> tuple[str, str]:
    explicit = labels.get("brakeline_level", "").upper()
    if explicit in LEVELS:
        return explicit, "label brakeline_level"
    if signal is not None and signal.reading == LAST_VALUE:
        code = _number(labels.get("xid", ""), value)
        level = xid_level(code)
        if level is not None:
            return level, f"XID {int(code)}: {xid_meaning(code)}"
        return L1, "XID value missing or not an XID"
    if signal is not None:
        return signal.level, f"DCGM signal {signal.key}"
    severity = SEVERITY_LABELS.get(labels.get("severity", "").lower())
    if severity is not None:
        return severity, f"label severity={labels['severity']}"
    return L1, "no level label"


def _number(text: str, fallback: float) -> float:
    try:
        return float(text)
    except ValueError:
        return fallback


# --- Reading series as DCGM means them (the agent protocol's detectors) ----------------------


def is_new_xid(previous: float | None, current: float) -> bool:
    """A new XID: a non-zero value different from the last one seen. The first value seen is
    new when non-zero (the gauge may hold an error from before the job started watching:
    safety first, as a dead GPU stays dead)."""
    if not math.isfinite(current) or current <= 0:
        return False
    return previous is None or current != previous


def is_rise(previous: float | None, current: float) -> bool:
    """A counter rose. The first value is the baseline; a drop is a reset, never an error."""
    if previous is None or not (math.isfinite(previous) and math.isfinite(current)):
        return False
    return current > previous


def agent_rules() -> tuple[dict, ...]:
    """The table as rule-pack entries, for DCGM names pushed through the agent protocol."""
    rules: list[dict] = [
        _rule(
            "dcgm-xid-fatal",
            SIGNALS_BY_KEY["dcgm-xid"],
            L4,
            "xid_change",
            {"values": list(FATAL_XIDS)},
            "GPU XID error (fatal)",
        ),
        _rule(
            "dcgm-xid",
            SIGNALS_BY_KEY["dcgm-xid"],
            L2,
            "xid_change",
            {"exclude": list(FATAL_XIDS)},
            "GPU XID error",
        ),
    ]
    for signal in SIGNALS[1:]:
        if signal.reading == COUNTER:
            rules.append(_rule(signal.key, signal, signal.level, "counter_rise", {}, signal.name))
        else:
            rules.append(
                _rule(
                    signal.key,
                    signal,
                    signal.level,
                    "threshold",
                    {"above": signal.threshold},
                    signal.name,
                )
            )
    return tuple(rules)


def _rule(key: str, signal: Signal, level: str, detector: str, params: dict, name: str) -> dict:
    action = "record" if signal.layer == PERFORMANCE else ACTION_FOR_LEVEL[level]
    # A GPU index travels in the name (DCGM_FI_DEV_XID_ERRORS.gpu3) or not at all.
    return {
        "key": key,
        "name": name,
        "layer": signal.layer,
        "metric": f"{signal.metric}|{signal.metric}.*",
        "detector": detector,
        "params": params,
        "per_node": True,
        "severity": level,
        "action": action,
        "clear_after": 1 if signal.reading != ABOVE else 3,
        "runbook": signal.runbook,
    }
