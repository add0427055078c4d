"""Alertmanager's webhook payload, parsed strictly (pure: runs with -p no:django)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from breakers.monitoring.alertmanager import PayloadError, parse_webhook


def payload(**changes):
    alert = {
        "status": "firing",
        "labels": {"alertname": "DCGMXidError", "Hostname": "gpu-b", "gpu": "3"},
        "annotations": {"summary": "XID 79", "value": "79"},
        "startsAt": "2026-12-02T01:02:03.123456789Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": "c0ffee0123456789",
    }
    body = {
        "version": "4",
        "groupKey": '{}:{alertname="DCGMXidError"}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "brakeline",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager",
        "alerts": [alert],
    }
    for key, value in changes.items():
        if key.startswith("alert_"):
            name = key.removeprefix("alert_")
            if value is ...:
                alert.pop(name)
            else:
                alert[name] = value
        else:
            body[key] = value
    return json.dumps(body).encode()


def test_a_v4_payload_parses():
    webhook = parse_webhook(payload())
    (alert,) = webhook.alerts
    assert webhook.status == "firing" and webhook.truncated_alerts == 0
    assert alert.alertname == "DCGMXidError" and alert.labels["gpu"] == "3"
    assert alert.starts_at == datetime(2026, 12, 2, 1, 2, 3, 123456, tzinfo=UTC)
    assert alert.ends_at is None  # Go's zero time: still firing


def test_offsets_and_unknown_fields_are_fine():
    webhook = parse_webhook(payload(alert_startsAt="2026-12-02T02:02:03+01:00", extra={"a": 1}))
    assert webhook.alerts[0].starts_at == datetime(2026, 12, 2, 1, 2, 3, tzinfo=UTC)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"version": 4}, "version"),
        ({"version": "3"}, "version"),
        ({"status": "pending"}, "status"),
        ({"truncatedAlerts": -1}, "truncatedAlerts"),
        ({"truncatedAlerts": True}, "truncatedAlerts"),
        ({"groupKey": None}, "groupKey"),
        ({"alerts": {}}, "alerts"),
        ({"alerts": ["x"]}, "alerts[0]"),
        ({"alerts": [{}] * 1001}, "alerts"),
        ({"alert_status": "FIRING"}, "alerts[0].status"),
        ({"alert_labels": {"alertname": 7}}, "alerts[0].labels.alertname"),
        ({"alert_labels": {"gpu": "1"}}, "alerts[0].labels.alertname"),
        ({"alert_labels": {"alertname": "a\x00b"}}, "alerts[0].labels.alertname"),
        ({"alert_labels": []}, "alerts[0].labels"),
        ({"alert_annotations": {"value": 79}}, "alerts[0].annotations.value"),
        ({"alert_startsAt": "yesterday"}, "alerts[0].startsAt"),
        ({"alert_startsAt": "2026-02-30T00:00:00Z"}, "alerts[0].startsAt"),
        ({"alert_startsAt": ...}, "alerts[0].startsAt"),
        ({"alert_endsAt": "0001-01-01T00:00:00+05:00"}, "alerts[0].endsAt"),
        ({"alert_fingerprint": "XYZ"}, "alerts[0].fingerprint"),
        ({"alert_fingerprint": "a" * 65}, "alerts[0].fingerprint"),
        ({"alert_fingerprint": ...}, "alerts[0].fingerprint"),
    ],
)
def test_every_wrong_field_is_named(changes, field):
    with pytest.raises(PayloadError) as error:
        parse_webhook(payload(**changes))
    assert field in error.value.fields


@pytest.mark.parametrize(
    "body", [b"", b"[]", b"nope", b'{"version": NaN}', b"\xff\xfe", b'"4"', b"[" * 100_000]
)
def test_a_body_that_is_no_object_is_refused(body):
    with pytest.raises(PayloadError) as error:
        parse_webhook(body)
    assert error.value.fields


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
ALERT_KEYS = st.sampled_from(
    ["status", "labels", "annotations", "startsAt", "endsAt", "fingerprint", "generatorURL"]
)


@settings(max_examples=100, deadline=None)
@given(
    top=st.dictionaries(
        st.sampled_from(["version", "groupKey", "status", "alerts", "truncatedAlerts", "receiver"]),
        JSON,
    ),
    alert=st.dictionaries(ALERT_KEYS, JSON),
)
def test_any_json_is_a_webhook_or_a_payload_error(top, alert):
    """Whatever the shape, the parser answers with a webhook or names fields; nothing else."""
    for body in (
        top,
        {**json.loads(payload()), **top},
        {**json.loads(payload()), "alerts": [alert]},
    ):
        try:
            parse_webhook(json.dumps(body).encode())
        except PayloadError as error:
            assert error.fields and all(isinstance(v, str) for v in error.fields.values())
