"""The write-up's pure parts: validating content, the automatic draft, the Markdown export and
rebuilding rows from a document (pure: runs with -p no:django)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from incidents.reviews.content import frozen_part, validate_content
from incidents.reviews.draft import IncidentFacts, chronology, draft
from incidents.reviews.durations import DeclaredSize, Row, measure
from incidents.reviews.export import (
    durations_from_document,
    row_as_dict,
    rows_from_document,
    to_markdown,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
FOLLOW_UP = {"text": "Clip gradients", "owner": "ana", "due_date": "2026-02-01", "done": False}


@pytest.mark.parametrize(
    ("raw", "errors"),
    [
        ({}, {}),
        ({"summary": "x", "follow_ups": [FOLLOW_UP]}, {}),
        ({"status": "published"}, {"status": "must be draft or final"}),
        ({"impact": 5}, {"impact": "must be text"}),
        ({"root_cause": "x" * 20_001}, {"root_cause": "at most 20000 characters"}),
        ({"follow_ups": "clip"}, {"follow_ups": "a list of at most 100 follow-ups"}),
        ({"follow_ups": [{**FOLLOW_UP, "text": " "}]}, {"follow_ups[0].text": "must not be empty"}),
        (
            {"follow_ups": [FOLLOW_UP, {**FOLLOW_UP, "due_date": "next week"}]},
            {"follow_ups[1].due_date": "a date, YYYY-MM-DD"},
        ),
        ({"follow_ups": [{**FOLLOW_UP, "done": "yes"}]}, {"follow_ups[0].done": "true or false"}),
        ({"follow_ups": [{**FOLLOW_UP, "owner": 7}]}, {"follow_ups[0].owner": "a username"}),
        ({"follow_ups": ["clip"]}, {"follow_ups[0].text": "each follow-up is an object"}),
    ],
)
def test_content_is_validated_field_by_field(raw, errors):
    assert validate_content(raw)[1] == errors


def test_clean_content_fills_defaults_strips_text_and_normalises_line_ends():
    clean, errors = validate_content(
        {"summary": "  one\r\ntwo  ", "follow_ups": [{"text": " clip ", "owner": ""}]}
    )
    assert errors == {}
    assert clean["status"] == "draft" and clean["summary"] == "one\ntwo"
    assert clean["impact"] == "" and clean["root_cause"] == ""
    assert clean["follow_ups"] == [{"text": "clip", "owner": None, "due_date": None, "done": False}]


def test_a_final_review_keeps_everything_but_the_done_flags():
    content = validate_content({"summary": "s", "follow_ups": [FOLLOW_UP]})[0]
    done = {**content, "follow_ups": [{**FOLLOW_UP, "done": True}]}
    edited = {**content, "summary": "rewritten"}
    assert frozen_part(done) == frozen_part(content)
    assert frozen_part(edited) != frozen_part(content)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


ROWS = [
    Row("first_anomalous_point", at(0), 60, message="First anomalous point: loss at step 60"),
    Row("alert_raised", at(3), 60, message="L3 NaN/Inf: loss is NaN at step 60"),
    Row("command_issued", at(3), None, data={"kind": "checkpoint_and_pause"}, message="pause #1"),
    Row("acknowledged", at(5), 60, "person", "ana", "L3 NaN/Inf acknowledged by ana"),
    Row("checkpoint_saved", at(11), 62, "agent", message="Checkpoint saved at /c.pt | 2 GB"),
    Row("resources_released", at(11), 62, "agent", message="Accelerators released"),
    Row("resumed", at(93), 62, "agent", message="Training resumed"),
]
FACTS = IncidentFacts(7, "NaN/Inf in loss or gradients (loss)", "L3", "research/llm", at(0), 60)


def test_the_draft_says_what_happened_when_and_who_acted():
    durations = measure(ROWS, at(0), 60, DeclaredSize(4, 8))
    text = draft(FACTS, ROWS, durations)
    assert set(text) == {
        "summary",
        "impact",
        "root_cause",
        "contributing_factors",
        "what_went_well",
    }
    summary = text["summary"]
    assert summary.startswith("L3 incident #7 on job research/llm: NaN/Inf in loss or gradients")
    assert "the alert was raised 3 s later" in summary
    assert "stopped with a confirmed checkpoint 8 s after the alert, 2 steps later" in summary
    assert "resumed 1 min 22 s after the stop" in summary
    assert "- 2026-01-01 12:00:05 UTC [+5 s] (step 60) L3 NaN/Inf acknowledged by ana — ana" in (
        summary
    )
    assert "Who acted: the system (alert raised, command issued); ana (acknowledged); " in summary
    assert "the training process (checkpoint saved, resources released, resumed)" in summary
    assert text["root_cause"] == ""  # a judgement: left to the writer
    assert "Training stood still for 1 min 22 s." in text["impact"]
    assert "32 accelerators: 0.10 accelerator-hours" in text["impact"]
    assert "The slowest link was time to recover: 1 min 22 s." in text["contributing_factors"]
    assert "time to notify" in text["contributing_factors"]  # not measured
    assert "checkpoint_and_pause on its own, 0 ms after the alert" in text["what_went_well"]


def test_an_unbraked_incident_drafts_no_stop_and_no_impact_figures():
    rows = ROWS[:2]
    text = draft(FACTS, rows, measure(rows, at(0), 60, None))
    assert "The timeline shows no confirmed stop of the training." in text["summary"]
    assert text["impact"] == ""
    assert len(chronology(FACTS, rows)) == 2


def document_of(rows: list[Row]) -> dict:
    durations = measure(rows, at(0), 60, DeclaredSize(4, 8))
    return {
        "incident": {
            "id": 7,
            "title": "NaN | Inf",
            "level": "L3",
            "status": "resolved",
            "job": {"id": 1, "name": "llm", "team": "research"},
            "first_anomalous_point": {"at": "2026-01-01T12:00:00Z", "step": 60},
        },
        "job_size": {"nodes": 4, "gpus_per_node": 8, "accelerator": ""},
        "timeline": [row_as_dict(row, index) for index, row in enumerate(rows)],
        "durations": durations.as_dict(),
        "review": {
            "status": "draft",
            "revision": 2,
            "updated_by": "ana",
            **draft(FACTS, rows, durations),
            "follow_ups": [{**FOLLOW_UP, "done": True}],
        },
    }


def test_rows_and_durations_rebuild_from_a_document():
    document = document_of(ROWS)
    assert rows_from_document(document) == ROWS
    assert durations_from_document(document).as_dict() == document["durations"]


def test_the_markdown_export_has_durations_write_up_follow_ups_and_timeline():
    text = to_markdown(document_of(ROWS))
    assert text.startswith("# Incident #7 review: NaN | Inf\n")
    assert "| Time to recover (slowest) | 1 min 22 s | 0 |" in text
    assert "| Time to notify | not measured |  |" in text
    assert "to the brake: 0.10 (32 accelerators, declared)." in text
    assert "## Root cause\n\n_Not written yet._" in text
    assert "| [x] | Clip gradients | ana | 2026-02-01 |" in text
    # A pipe inside a cell is escaped, so the table keeps its columns.
    assert "Checkpoint saved at /c.pt \\| 2 GB" in text
    assert text.index("## Summary") < text.index("## Follow-ups") < text.index("## Timeline")
