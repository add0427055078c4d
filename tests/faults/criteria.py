"""When a row of the fault table passes: the counts that must be zero, the console back to
health, the bounds a fault declares, and the proof that the fault struck what it claims to test
(a row whose NaN was braked before the part went down proves nothing about that part).

bench/faults.py measures and prints; these criteria are the tests'.
"""

from __future__ import annotations

ZERO_COLUMNS = (
    "lost",
    "duplicated",
    "nan_missed",
    "nan_doubled",
    "hung_missed",
    "commands_doubled",
    "false_brakes",
    "alerts_doubled",
    "other_alerts",
    "pages_missed",
    "pages_doubled",
)


def failures(result: dict) -> list[str]:
    """Every reason the row fails, in words; [] when it passes."""
    bad = [f"{column}={result[column]}" for column in ZERO_COLUMNS if result[column]]
    bad += [f"unexpected alert {text}" for text in result.get("other_alert_texts", [])]
    if result["health_red"] is False and result.get("red_required", True):
        bad.append("health stayed green while a part was down")
    if not result["health_green"]:
        bad.append("the console did not recover")
    within, late = result.get("hung_within"), result.get("hung_late")
    if within is not None and late is not None and late > within:
        bad.append(f"the hung job was caught {late:.1f} s after its deadline (at most {within:g})")
    if result.get("brake_checkpoint_fails") and not result.get("failed_brake_pages"):
        bad.append("the brake whose checkpoint failed paged nobody")
    bound, waited = result.get("health_wait_within"), result.get("health_wait")
    if bound is not None and (waited is None or waited > bound):
        shown = "—" if waited is None else f"{waited:.2f}"
        bad.append(f"/api/v1/health took {shown} s to answer (at most {bound:g})")
    if "overlap" not in result:
        bad.append("the fault recorded no proof that it overlapped what it tests")
    elif result["overlap"]:
        bad.append(f"the fault did not overlap what it tests: {result['overlap']}")
    return bad
