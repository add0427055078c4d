"""The people API's hostile inputs: query-string integers and times, and JSON bodies.

Every one is a 4xx naming the field (the parameter, ``body`` or the duplicated key), with
nothing written: integers of more than 4,300 digits (``int()`` raises ``ValueError``), ids out
of a bigint's range (the embedded SQLite driver raised ``OverflowError``), ``"1_000"`` and
``" +5 "`` (``int()`` takes both), moments that overflow once in UTC, bodies nested thousands
of levels deep (``RecursionError`` in DRF's parser) and bodies with a key twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from breakers.models import Command
from incidents.models import AuditEntry
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db

NINES = "9" * 5000
MAX_ID = 2**63 - 1
METRICS = "/api/v1/agent/metrics"


def get(api, path: str, **params):
    return api.client.get(path, params, headers=api.headers)


def post_raw(api, path: str, body: bytes | str, content_type: str = "application/json"):
    return api.client.post(path, data=body, content_type=content_type, headers=api.headers)


# -- integer query parameters ---------------------------------------------------------------------
ID_PARAMETERS = [
    ("/api/v1/alerts", "job"),
    ("/api/v1/escalations", "job"),
    ("/api/v1/silences", "team"),
    ("/api/v1/audit", "team"),
]
BAD_IDS = [
    NINES,
    "99999999999999999999",
    str(MAX_ID + 1),
    "0",
    "-1",
    "1_000",
    " 5",
    "+5",
    " +5 ",
    "5 ",
    "²",
    "٣",
    "1e3",
    "0x10",
    "",
]


@pytest.mark.parametrize("value", BAD_IDS)
@pytest.mark.parametrize(("path", "name"), ID_PARAMETERS)
def test_ids_in_query_strings_are_400s_naming_the_parameter(scene, path, name, value):
    answer = get(scene.api("admin"), path, **{name: value})
    assert answer.status_code == 400, (answer.status_code, answer.content[:200])
    body = answer.json()
    assert body["error"] == "invalid" and list(body["fields"]) == [name], body
    assert "from 1 to 9223372036854775807" in body["fields"][name]


@pytest.mark.parametrize(("path", "name"), ID_PARAMETERS)
def test_ids_in_range_are_still_filters(scene, path, name):
    api = scene.api("admin")
    value = scene.job_id if name == "job" else scene.team.pk
    assert get(api, path, **{name: value}).status_code == 200
    assert get(api, path, **{name: MAX_ID}).status_code in (200, 404)  # nobody's: never a 500


LIMITS = [
    ("/api/v1/alerts", 500),
    ("/api/v1/escalations", 500),
    ("/api/v1/audit", 500),
    ("/api/v1/teams/{team}/rules/versions", 200),
]


@pytest.mark.parametrize("value", [NINES, "0", "-1", "1_0", " 10", "+10", "²"])
@pytest.mark.parametrize(("path", "most"), LIMITS)
def test_limits_are_400s_naming_limit(scene, path, most, value):
    api = scene.api("admin")
    path = path.format(team=scene.team.pk)
    answer = get(api, path, limit=value)
    assert answer.status_code == 400, (answer.status_code, answer.content[:200])
    assert answer.json()["fields"] == {"limit": f"a whole number from 1 to {most}"}
    assert get(api, path, limit=most).status_code == 200
    assert get(api, path, limit=most + 1).status_code == 400


SERIES_BAD = [
    ("from_step", "1_000"),
    ("from_step", " +5 "),
    ("from_step", "+5"),
    ("from_step", "-1"),
    ("from_step", NINES),
    ("to_step", str(2**63)),
    ("to_step", "٣"),
    ("max_points", "1"),
    ("max_points", "10001"),
    ("max_points", " 200"),
    ("rank", "-1"),
    ("rank", str(2**31)),
    ("rank", "1_0"),
    ("ranks", "²"),
    ("ranks", "1,1_0"),
    ("ranks", "1," + NINES),
]


@pytest.mark.parametrize(("name", "value"), SERIES_BAD)
def test_series_parameters_are_parsed_strictly(scene, name, value):
    answer = get(
        scene.api("viewer"), f"/api/v1/jobs/{scene.job_id}/series", names="loss", **{name: value}
    )
    assert answer.status_code == 400, (answer.status_code, answer.content[:200])
    assert list(answer.json()["fields"]) == [name]


def test_series_parameters_in_range_are_taken(scene):
    api = scene.api("viewer")
    answer = get(
        api,
        f"/api/v1/jobs/{scene.job_id}/series",
        names="loss",
        from_step="0",
        to_step=str(MAX_ID),
        max_points="10000",
        rank="0",
        ranks="1, 2",
        spread="0",
    )
    assert answer.status_code == 200, answer.content
    assert (answer.json()["from_step"], answer.json()["to_step"]) == (0, MAX_ID)
    # Empty means absent here, as before (the chart's client leaves them out or empty).
    answer = get(
        api,
        f"/api/v1/jobs/{scene.job_id}/series",
        names="loss",
        from_step="",
        max_points="",
        rank="",
    )
    assert answer.status_code == 200 and answer.json()["max_points"] == 2000


# -- moments --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("until", "9999-12-31T23:00:00-05:00"),  # the year 10000 in UTC
        ("until", "9999-12-31"),
        ("until", "2026-02-30"),  # well formed, no such day: ValueError in parse_date
        ("until", "2026-01-01T25:00:00"),
        ("since", "0001-01-01T00:00:00+01:00"),  # before the year 1 in UTC
        ("since", "1969-12-31T23:59:59Z"),
        ("until", "nope"),
    ],
)
def test_incident_report_periods_out_of_range_are_400s(scene, name, value):
    answer = get(
        scene.api("admin"), f"/api/v1/teams/{scene.team.pk}/incident-report", **{name: value}
    )
    assert answer.status_code == 400, (answer.status_code, answer.content[:200])
    assert list(answer.json()["fields"]) == [name]


def test_incident_report_periods_in_range_are_taken(scene):
    api = scene.api("admin")
    url = f"/api/v1/teams/{scene.team.pk}/incident-report"
    answer = get(api, url, since="2026-01-01", until="9998-12-30T23:00:00-05:00")
    assert answer.status_code == 200, answer.content
    assert answer.json()["until"].startswith("9998-12-3")


@pytest.mark.parametrize("path", ["shifts?ending_after", "oncall?at"])
@pytest.mark.parametrize("value", ["9999-12-31T23:00:00-05:00", "2026-02-30T00:00:00Z", "x"])
def test_on_call_times_out_of_range_are_400s(scene, path, value):
    route, name = path.split("?")
    answer = get(scene.api("admin"), f"/api/v1/teams/{scene.team.pk}/{route}", **{name: value})
    assert answer.status_code == 400, (answer.status_code, answer.content[:200])
    assert list(answer.json()["fields"]) == [name]


# -- JSON bodies ----------------------------------------------------------------------------------
BODY_PATHS = ["/api/v1/jobs/{job}/pause", "/api/v1/teams/{team}/rules", "/api/v1/silences"]


def _path(scene, template: str) -> str:
    return template.format(job=scene.job_id, team=scene.team.pk)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 10_000 + b"]" * 10_000,
        b'{"reason": ' * 10_000 + b"1" + b"}" * 10_000,
        b'{"reason": ' + b"[" * 40 + b"]" * 40 + b"}",  # within the stack, past 32 levels
        b'{"reason": ' + b"1" * 5_000 + b"}",  # int() of more than 4,300 digits
        b'{"reason": NaN}',
        b'{"reason": "x"',
        b"\xff\xfe{}",
    ],
    ids=["deep-array", "deep-object", "33-levels", "long-int", "nan", "truncated", "not-utf8"],
)
@pytest.mark.parametrize("template", BODY_PATHS)
def test_unreadable_json_bodies_are_400s_naming_body(scene, template, body):
    before = AuditEntry.objects.count()
    answer = post_raw(scene.api("admin"), _path(scene, template), body)
    assert answer.status_code == 400, (answer.status_code, answer.content[:200])
    assert answer.json()["error"] == "malformed_json"
    assert list(answer.json()["fields"]) == ["body"], answer.json()
    assert Command.objects.filter(job_id=scene.job_id).count() == 0
    assert AuditEntry.objects.count() == before  # refused before any service ran


@pytest.mark.parametrize("template", BODY_PATHS)
def test_a_key_twice_in_a_person_body_is_a_400_naming_the_key(scene, template):
    body = '{"reason": "first", "why": "x", "reason": "second"}'
    answer = post_raw(scene.api("admin"), _path(scene, template), body)
    assert answer.status_code == 400, (answer.status_code, answer.content[:200])
    assert answer.json()["error"] == "malformed_json"
    assert answer.json()["fields"] == {"reason": "appears twice in one object"}
    assert Command.objects.filter(job_id=scene.job_id).count() == 0


def test_a_nested_key_twice_is_refused_too(scene):
    body = {"why": "x", "changes": [{"op": "update", "key": "loss-rising", "fields": {}}]}
    text = json.dumps(body).replace('"fields": {}', '"fields": {"a": 1, "a": 2}')
    answer = post_raw(scene.api("admin"), f"/api/v1/teams/{scene.team.pk}/rules", text)
    assert answer.status_code == 400, answer.content
    assert answer.json()["fields"] == {"a": "appears twice in one object"}


def test_a_well_formed_body_is_still_taken(scene):
    api = scene.api("admin")
    answer = post_raw(api, f"/api/v1/jobs/{scene.job_id}/pause", json.dumps({"reason": "ok"}))
    assert answer.status_code in (200, 201, 202), answer.content
    assert Command.objects.filter(job_id=scene.job_id).count() == 1


@pytest.mark.parametrize(
    ("content_type", "field"),
    [
        ("multipart/form-data", "body"),  # no boundary: DRF's ParseError
        ("application/json; charset=bz2_codec", "Content-Type"),  # not a text encoding
        ("application/json; charset=nonesuch", "body"),  # unknown: Django ignores it (UTF-8)
    ],
)
def test_bodies_that_cannot_be_parsed_name_the_field(scene, content_type, field):
    api = scene.api("admin")
    body = b"[" * 10_000 if field == "body" else b"{}"
    answer = api.client.generic(
        "POST",
        f"/api/v1/jobs/{scene.job_id}/pause",
        body,
        content_type=content_type,
        headers=api.headers,
    )
    assert answer.status_code == 400, (answer.status_code, answer.content[:200])
    assert list(answer.json()["fields"]) == [field]


def test_an_unsupported_media_type_names_the_content_type(scene):
    answer = post_raw(
        scene.api("admin"),
        f"/api/v1/jobs/{scene.job_id}/pause",
        b"reason",
        content_type="text/plain",
    )
    assert answer.status_code == 415
    assert list(answer.json()["fields"]) == ["Content-Type"]


# -- agent bodies that are JSON but not objects ---------------------------------------------------
@pytest.mark.parametrize("body", [b"[]", b'"x"', b"1", b"null", b"true"])
def test_agent_bodies_that_are_not_objects_name_body(agent_post, body):
    answer = agent_post(METRICS, body)
    assert answer.status_code == 400
    assert answer.json()["error"] == "malformed_json"
    assert answer.json()["fields"] == {"body": "must be a JSON object"}


# -- the websocket: `true` is not command 1 -------------------------------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("command_id", [True, False, "1", 1.0, None])
def test_a_websocket_ack_id_must_be_a_whole_number(live_console, agent, command_id):
    from websockets.sync.client import connect

    url = live_console.replace("http://", "ws://") + "/ws/agent/"
    with connect(url, additional_headers=agent.headers) as socket:
        socket.send(json.dumps({"type": "ack", "id": command_id, "status": "succeeded"}))
        message = json.loads(socket.recv(timeout=10))
    assert (message["type"], message["error"]) == ("error", "invalid"), message
    assert list(message["fields"]) == ["id"]


# -- the embedded SQLite mode: what overflowed in its driver -------------------------------------
EMBEDDED_SCRIPT = """
import django, json, os
os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
django.setup()
from django.test.utils import setup_test_environment
setup_test_environment()
from django.test import Client
from incidents.jobs import create_job
from incidents.models import PersonalToken
from tests.support.authz import make_member
job = create_job("t", "j").job
token = PersonalToken.issue(make_member(job.team, "admin"), "tests")[1]
client = Client(headers={"Authorization": f"Token {token}"})
paths = [
    "/api/v1/alerts?job=99999999999999999999",
    "/api/v1/escalations?job=99999999999999999999",
    f"/api/v1/teams/{job.team_id}/incident-report?until=9999-12-31T23:00:00-05:00",
    f"/api/v1/teams/{job.team_id}/incident-report?until=9998-12-30T23:00:00-05:00",
    f"/api/v1/alerts?job={job.pk}",
]
answers = [client.get(path) for path in paths]
print(json.dumps([[a.status_code, sorted(a.json()["fields"]) if a.status_code >= 400 else []]
                  for a in answers]))
"""


@pytest.mark.embedded
def test_embedded_sqlite_refuses_out_of_range_ids_and_moments(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env.pop("BRAKELINE_SECRET_KEY", None)
    env["BRAKELINE_DATA_DIR"] = str(tmp_path)
    for command in (["manage.py", "migrate", "--verbosity", "0"], ["-c", EMBEDDED_SCRIPT]):
        result = subprocess.run(
            [sys.executable, *command],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr[-3000:]
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    assert answers == [[400, ["job"]], [400, ["job"]], [400, ["until"]], [200, []], [200, []]]


# -- an agent's Content-Length header: int() of it was a 500 ------------------------------------
@pytest.mark.parametrize("path", [METRICS, "/api/v1/agent/snapshots"])
def test_a_content_length_of_thousands_of_digits_is_a_413(client, agent, path):
    answer = client.post(
        path,
        data=b"{}",
        content_type="application/json",
        headers=agent.headers,
        CONTENT_LENGTH=NINES,
    )
    assert answer.status_code == 413, (answer.status_code, answer.content[:200])
    assert list(answer.json()["fields"]) in (["body"], ["snapshot"])
    assert len(answer.content) < 1000  # the header is not echoed whole


@pytest.mark.parametrize(
    ("declared", "more"),
    [
        (NINES, True),
        ("0" * 30 + "5", False),
        ("101", True),
        ("100", False),
        ("²", False),
        ("1_0", False),
        (" 5", False),
        ("", False),
    ],
)
def test_what_a_content_length_declares(rf, declared, more):
    from console.api.agent import declares_more_than

    request = rf.post("/", data=b"", content_type="application/json", CONTENT_LENGTH=declared)
    assert declares_more_than(request, 100) is more
