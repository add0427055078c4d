"""The job page at a thousand ranks (bench/_thousand.py seeds it through the ingest service):
the ranks table a page at a time, sorted and searched in SQL with the job's counts on top; the
charts' series one picked rank over the band of all; the alert one line."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model

from bench._thousand import SILENT, STRAGGLERS, loss, seed_thousand
from incidents.models import Alert, Job, Membership, Role

pytestmark = pytest.mark.django_db


@pytest.fixture
def thousand(client):
    seeded = seed_thousand("vision", "llm-1k", steps=60)
    user = get_user_model().objects.create_user("ana", password="pw")
    team_id = Job.objects.get(pk=seeded.job_id).team_id
    Membership.objects.create(user=user, team_id=team_id, role=Role.VIEWER)
    client.force_login(user)
    return seeded


def ranks_of(client, job_id: int, **params) -> tuple[str, list[int]]:
    response = client.get(f"/jobs/{job_id}/", {"partial": "ranks", **params})
    assert response.status_code == 200
    html = response.content.decode()
    return html, [int(r) for r in re.findall(r'<tr data-rank="(\d+)"', html)]


def test_the_table_shows_a_page_with_the_whole_jobs_counts_silent_first(client, thousand):
    html, rows = ranks_of(client, thousand.job_id)
    assert "1,000 ranks · 7 silent · 2 stragglers" in html
    heard = [r for r in range(60) if r not in SILENT][:43]
    assert rows == [*SILENT, *heard]  # 50 rows: the silent first, then by rank
    assert "1–50 of 1,000 · page 1 of 20" in html
    _, last = ranks_of(client, thousand.job_id, page="20")
    assert last == [r for r in range(940, 1000) if r not in SILENT][-50:]
    assert html.count('class="badge bad"') == len(SILENT)


def test_sorted_by_pace_and_searched_by_rank_or_host(client, thousand):
    html, slowest = ranks_of(client, thousand.job_id, sort="slowest")
    assert slowest[:2] == list(STRAGGLERS) and html.count("badge warn") == 2
    _, behind = ranks_of(client, thousand.job_id, sort="behind")
    assert behind[: len(SILENT) + 2] == [*SILENT, *STRAGGLERS]
    html, found = ranks_of(client, thousand.job_id, q="713")
    assert found == [713] and "1–1 of 1 · page 1 of 1" in html
    _, host = ranks_of(client, thousand.job_id, q="gpu-089")
    assert host == [713, 712, *range(714, 720)]  # node gpu-089, its silent rank first


@pytest.mark.parametrize(
    "params", [{"page": "x"}, {"page": "99999"}, {"sort": "'; drop"}, {"q": "zz" * 99}]
)
def test_a_bad_page_sort_or_search_is_a_page_still(client, thousand, params):
    response = client.get(f"/jobs/{thousand.job_id}/", {"partial": "ranks", **params})
    assert response.status_code == 200


def test_the_partial_asks_the_same_few_queries_at_a_thousand_ranks(
    client, thousand, django_assert_max_num_queries
):
    with django_assert_max_num_queries(12):
        ranks_of(client, thousand.job_id, page="7", sort="slowest")


def test_the_alert_counts_the_silent_ranks_and_names_two(thousand):
    description = Alert.objects.get(pk=thousand.alert_id).description
    assert description.startswith(
        "ranks 12, 713 and 5 more of 1,000 are silent (gpu-001, gpu-089 and 3 more); "
        "993 other ranks still heartbeating: no heartbeat for "
    )


def test_the_series_is_one_ranks_line_over_the_band_of_all(client, thousand):
    response = client.get(
        f"/api/v1/jobs/{thousand.job_id}/series", {"names": "loss", "rank": "713"}
    )
    loss = response.json()["series"]["loss"]
    assert loss["rank"] == 713 and loss["ranks"] == {}
    assert loss["steps"] == list(range(20))  # silent 40 steps before the others' last
    spread = loss["spread"]
    assert spread["steps"] == list(range(60)) and len(spread["low"]) == 60
    assert spread["low"][0] < spread["high"][0]


def test_the_jobs_latest_loss_is_rank_0s_not_any_of_a_thousand(client, thousand):
    job = client.get(f"/api/v1/jobs/{thousand.job_id}").json()
    assert job["latest_loss"] == pytest.approx(loss(59, 0))
