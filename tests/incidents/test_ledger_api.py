"""The goodput ledger over REST: JSON and CSV of the same figures, and every hostile query
parameter a 400 naming it (never a 500, nothing computed for it)."""

from __future__ import annotations

import csv
import io

import pytest
from django.test import Client

from incidents.jobs import create_job
from tests.incidents.test_ledger_flow import team  # noqa: F401 (a fixture)
from tests.support.review import run_flow

pytestmark = pytest.mark.django_db
PERIOD = "since=2026-03-02T08:00:00Z&until=2026-03-02T10:00:00Z"


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_json_and_csv_carry_the_same_figures(team):  # noqa: F811
    run_flow(team)
    client = client_of(team.person("viewer"))
    url = f"/api/v1/teams/{team.team.pk}/ledger?{PERIOD}"
    document = client.get(url).json()
    assert document["total"]["wall_seconds"] == 7200.0 and document["total"]["lost_seconds"] == 93.0
    answer = client.get(f"/api/v1/teams/{team.team.pk}/ledger.csv?{PERIOD}")
    assert answer["Content-Type"].startswith("text/csv")
    assert "attachment" in answer["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(answer.content.decode())))
    (incident,) = [row for row in rows if row["scope"] == "incident"]
    assert (incident["alarm_after_seconds"], incident["brake_after_seconds"]) == ("3.0", "11.0")
    assert incident["lost_saving_seconds"] == "8.0" and incident["lost_recovery_seconds"] == "82.0"
    one_job = client.get(f"{url}&job={team.job_id}").json()
    assert one_job["job"] == team.job_id and one_job["total"] == document["total"]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("since=yesterday", "since"),
        ("until=2026-02-30", "until"),
        ("since=2026-03-02&until=2026-03-01", "since"),
        ("since=1990-01-01&until=2026-03-01", "since"),  # longer than the ledger reads at once
        ("job=abc", "job"),
        ("job=-1", "job"),
        ("job=99999999999999999999999", "job"),
        ("job=1&job=2", "job"),
        ("colour=blue", "colour"),
        ("since=2026-03-02T00:00:00%2B23:00", "since"),
    ],
)
def test_hostile_parameters_are_a_400_naming_them(team, query, field):  # noqa: F811
    answer = client_of(team.person("viewer")).get(f"/api/v1/teams/{team.team.pk}/ledger?{query}")
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["fields"]


def test_another_teams_job_or_team_is_refused(team):  # noqa: F811
    other = create_job("elsewhere", "their-run").job
    client = client_of(team.person("viewer"))
    answer = client.get(f"/api/v1/teams/{team.team.pk}/ledger?job={other.pk}")
    assert answer.status_code == 400 and "job" in answer.json()["fields"]
    assert client.get(f"/api/v1/teams/{other.team_id}/ledger").status_code == 404
    assert Client().get(f"/api/v1/teams/{team.team.pk}/ledger").status_code in (401, 403)
