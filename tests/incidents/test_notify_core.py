"""The pure cores of notifications: routing, policy validation, backoff, content."""

from __future__ import annotations

import math

import pytest

from incidents.notifications.routing import (
    DEFAULT_RULES,
    AlertFacts,
    PolicyError,
    action_text,
    backoff_seconds,
    channels_for,
    duration_text,
    render,
    validate_rules,
)


@pytest.mark.parametrize(
    ("layer", "level", "expected"),
    [
        ("health", "L1", ["sms", "phone"]),
        ("health", "L4", ["sms", "phone"]),
        ("stability", "L1", ["chat"]),
        ("stability", "L2", ["chat"]),
        ("stability", "L3", ["chat", "phone"]),
        ("stability", "L4", ["chat", "phone"]),
        ("performance", "L1", ["digest"]),
        ("performance", "L4", ["digest"]),
    ],
)
def test_default_routing_follows_the_spec_table(layer, level, expected):
    assert channels_for(DEFAULT_RULES, layer, level) == expected


def test_the_defaults_are_a_valid_policy():
    assert validate_rules(DEFAULT_RULES) == DEFAULT_RULES


def test_performance_never_reaches_a_phone_even_if_a_rule_is_smuggled_in():
    rules = [*DEFAULT_RULES, {"layer": "performance", "min_level": "L1", "channels": ["chat"]}]
    assert channels_for(rules, "performance", "L4") == ["digest"]


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        (
            [
                {"layer": "health", "min_level": "L1", "channels": ["phone", "sms"]},
                {"layer": "stability", "min_level": "L1", "channels": ["chat"]},
            ],
            "L3 stability alerts must go to at least two channels, one of them phone; this "
            "policy sends them to chat.",
        ),
        (
            [
                {"layer": "health", "min_level": "L1", "channels": ["sms", "email"]},
                {"layer": "stability", "min_level": "L1", "channels": ["chat", "phone"]},
            ],
            "L3 health alerts must go to at least two channels, one of them phone; this "
            "policy sends them to email, sms.",
        ),
        (
            [
                {"layer": "health", "min_level": "L1", "channels": ["phone"]},
                {"layer": "stability", "min_level": "L1", "channels": ["chat", "phone"]},
            ],
            "L3 health alerts must go to at least two channels, one of them phone; this "
            "policy sends them to phone.",
        ),
        (
            [
                {"layer": "health", "min_level": "L1", "channels": ["phone", "sms"]},
                {"layer": "stability", "min_level": "L4", "channels": ["chat", "phone"]},
            ],
            "L3 stability alerts must go to at least two channels, one of them phone; this "
            "policy sends them to nothing.",
        ),
        (
            [*DEFAULT_RULES, {"layer": "performance", "channels": ["phone"]}],
            "rule 5: performance findings go to the daily digest, never to a phone.",
        ),
        ([{"layer": "gpu", "channels": ["chat"]}], "rule 1: layer must be one of"),
        ([{"layer": "health", "channels": ["pager"]}], "rule 1: channels must be a non-empty"),
        ([{"layer": "health", "min_level": "L9", "channels": ["sms"]}], "rule 1: min_level"),
        ([], "A policy needs a non-empty list of rules."),
        ("chat", "A policy needs a non-empty list of rules."),
    ],
)
def test_policies_that_break_the_spec_are_refused_with_a_clear_message(rules, message):
    with pytest.raises(PolicyError) as refused:
        validate_rules(rules)
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize(
    ("attempt", "seconds"), [(1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0), (10, 300.0)]
)
def test_backoff_doubles_up_to_a_cap(attempt, seconds):
    assert backoff_seconds(attempt) == seconds


@pytest.mark.parametrize(
    ("level", "action", "text"),
    [
        ("L3", "checkpoint_and_pause", "paused"),
        ("L4", "terminate", "terminated"),
        ("L1", "checkpoint_and_pause", "proposed: checkpoint_and_pause"),
        ("L2", "none", "no action taken"),
    ],
)
def test_action_taken_or_proposed(level, action, text):
    assert action_text(level, action) == text


@pytest.mark.parametrize(
    ("seconds", "steps", "text"),
    [(0, 0, "0s"), (42.4, 3, "42s (3 steps)"), (130, 0, "2m 10s"), (7260, 0, "2h 1m")],
)
def test_duration_text(seconds, steps, text):
    assert duration_text(seconds, steps) == text


FACTS = AlertFacts(
    level="L3",
    team="research",
    job_id=7,
    job_name="llama-7b",
    metric="loss",
    value=math.nan,
    threshold=None,
    step=4512,
    duration_seconds=0.0,
    duration_steps=0,
    node="node-03",
    action="checkpoint_and_pause",
    runbook_suggestion="NaN/Inf: check the learning rate and the last data batch",
    link="https://brakeline.example/jobs/7/",
)


def test_the_first_line_fits_a_lock_screen_and_the_body_carries_every_fact():
    message = render(FACTS)
    assert message.first_line == (
        "L3 research/llama-7b: loss is NaN on node-03 at step 4512 — paused"
    )
    assert len(message.first_line) <= 100
    for fact in (
        "Level: L3",
        "Metric: loss",
        "Value: NaN",
        "Threshold: none",
        "Lasting: 0s",
        "Job: #7 research/llama-7b",
        "Node: node-03",
        "Action: paused",
        "Next step: NaN/Inf: check the learning rate",
        "Open: https://brakeline.example/jobs/7/",
    ):
        assert fact in message.body


def test_a_finite_value_names_its_threshold_and_the_sms_keeps_the_link():
    facts = AlertFacts(**{**FACTS.__dict__, "value": 9.5, "threshold": 4.0, "node": ""})
    message = render(facts)
    assert message.first_line.startswith("L3 research/llama-7b: loss 9.5 past 4 at step 4512")
    sms = message.sms()
    assert sms.startswith(message.first_line) and sms.endswith("/jobs/7/")
    assert len(message.sms(limit=60)) == 60
