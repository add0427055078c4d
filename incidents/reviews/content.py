"""A write-up's content as plain data: validating what a writer sends (pure, no Django).

The REST API and the review page's form both hand the service a dict; this module is the one
place that says what a valid write-up is, so both refuse the same things the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date
from typing import Any

TEXT_FIELDS = ("summary", "impact", "root_cause", "contributing_factors", "what_went_well")
STATUSES = ("draft", "final")
MAX_TEXT = 20_000
MAX_FOLLOW_UP_TEXT = 1_000
MAX_FOLLOW_UPS = 100


def validate_content(raw: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The clean content and the errors, per field (``follow_ups[2].due_date``).

    Clean content: the five text sections (missing ones are empty), ``status`` (draft unless
    given) and ``follow_ups``, each ``{"text", "owner" (a username or None), "due_date"
    (ISO date string or None), "done"}``. Texts are stripped; owners are checked by the caller,
    who knows the team's members.
    """
    errors: dict[str, str] = {}
    clean: dict[str, Any] = {"status": raw.get("status") or "draft"}
    if clean["status"] not in STATUSES:
        errors["status"] = "must be draft or final"
    for name in TEXT_FIELDS:
        value = raw.get(name) or ""
        if not isinstance(value, str):
            errors[name] = "must be text"
        elif len(value) > MAX_TEXT:
            errors[name] = f"at most {MAX_TEXT} characters"
        # Browsers send form text with CRLF line ends; the API, with LF. One form, so a final
        # review re-sent unchanged from the page compares equal to what the API stored.
        clean[name] = value.replace("\r\n", "\n").strip() if isinstance(value, str) else ""
    follow_ups = raw.get("follow_ups") or []
    if not isinstance(follow_ups, list) or len(follow_ups) > MAX_FOLLOW_UPS:
        errors["follow_ups"] = f"a list of at most {MAX_FOLLOW_UPS} follow-ups"
        follow_ups = []
    clean["follow_ups"] = []
    for index, item in enumerate(follow_ups):
        item_clean, item_errors = _follow_up(item)
        clean["follow_ups"].append(item_clean)
        errors.update({f"follow_ups[{index}].{key}": why for key, why in item_errors.items()})
    return clean, errors


def _follow_up(item: Any) -> tuple[dict[str, Any], dict[str, str]]:
    if not isinstance(item, Mapping):
        return {}, {"text": "each follow-up is an object"}
    errors = {}
    text = item.get("text")
    if not isinstance(text, str) or not text.strip():
        errors["text"] = "must not be empty"
        text = ""
    elif len(text.strip()) > MAX_FOLLOW_UP_TEXT:
        errors["text"] = f"at most {MAX_FOLLOW_UP_TEXT} characters"
    owner = item.get("owner") or None
    if owner is not None and not isinstance(owner, str):
        errors["owner"] = "a username"
    due = item.get("due_date") or None
    if due is not None:
        try:
            due = date.fromisoformat(str(due)).isoformat()
        except ValueError:
            errors["due_date"] = "a date, YYYY-MM-DD"
    done = item.get("done", False)
    if not isinstance(done, bool):
        errors["done"] = "true or false"
    return {"text": text.strip(), "owner": owner, "due_date": due, "done": done is True}, errors


def frozen_part(content: Mapping[str, Any]) -> dict[str, Any]:
    """What a final review keeps fixed: everything but the follow-ups' done flags (follow-ups
    get done long after the review is signed off)."""
    return {
        **{name: content.get(name, "") for name in TEXT_FIELDS},
        "follow_ups": [
            {key: value for key, value in item.items() if key != "done"}
            for item in content.get("follow_ups", [])
        ],
    }
