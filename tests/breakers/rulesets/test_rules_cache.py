"""The evaluator's rules are built once per content of the rule rows, never used stale: a rule
changed by any path (a rule-set change, a save as the admin does, an UPDATE in SQL) is in the
very next evaluation's rules, and nothing is rebuilt while the rows are as they were."""

from __future__ import annotations

import logging

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from breakers.detection import rules as rules_module
from breakers.detection import rulesets
from breakers.detection.evaluation import evaluate_job
from breakers.detection.rules import rules_for_job
from breakers.models import Rule
from tests.breakers.rulesets.conftest import disable

pytestmark = pytest.mark.django_db


@pytest.fixture
def builds(monkeypatch):
    """How many rows were built into rules (``Rule.to_spec``, which it still runs)."""
    calls = []
    real = Rule.to_spec

    def counted(row):
        calls.append(row.pk)
        return real(row)

    monkeypatch.setattr(Rule, "to_spec", counted)
    return calls


def enabled(job_id: int) -> dict[str, bool]:
    return {rule.key: rule.enabled for rule in rules_for_job(job_id)}


def test_nothing_changed_one_statement_and_no_rebuild(crew, builds):
    first = rules_for_job(crew.job_id)
    assert builds  # the first call builds
    builds.clear()
    with CaptureQueriesContext(connection) as statements:
        again = rules_for_job(crew.job_id)
    assert again == first and builds == []
    assert len(statements) == 1


def test_the_evaluation_reads_the_rules_without_rebuilding_them(crew, builds):
    evaluate_job(crew.job_id, tick_at=0.0)
    builds.clear()
    evaluate_job(crew.job_id, tick_at=1.0)
    assert builds == []


def test_a_rule_set_change_is_in_the_next_rules(crew):
    assert enabled(crew.job_id)["loss-deviation"] is True
    rulesets.change_rules(crew.person("admin"), crew.team.pk, "too noisy", disable())
    assert enabled(crew.job_id)["loss-deviation"] is False


def test_a_saved_row_is_in_the_next_rules(crew):
    assert enabled(crew.job_id)["loss-rising"] is True
    row = Rule.objects.get(team=None, key="loss-rising")
    row.enabled = False
    row.full_clean()
    row.save()  # what the admin's change form ends with
    assert enabled(crew.job_id)["loss-rising"] is False


def test_a_row_updated_in_sql_is_in_the_next_rules(crew, builds):
    assert enabled(crew.job_id)["loss-rising"] is True
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Rule._meta.db_table} SET enabled = false WHERE team_id IS NULL AND key = %s",
            ["loss-rising"],
        )
    assert enabled(crew.job_id)["loss-rising"] is False
    with connection.cursor() as cursor:  # back as it was: the rules are as they were too
        cursor.execute(
            f"UPDATE {Rule._meta.db_table} SET enabled = true WHERE key = %s", ["loss-rising"]
        )
    assert enabled(crew.job_id)["loss-rising"] is True


def test_a_deleted_or_added_row_is_in_the_next_rules(crew):
    rules_for_job(crew.job_id)
    Rule.objects.filter(team=None, key="loss-rising").delete()
    assert "loss-rising" not in enabled(crew.job_id)
    row = Rule.objects.get(team=None, key="loss-deviation")
    row.pk, row.team, row.key = None, crew.team, "loss-deviation-2"
    row.save()
    assert "loss-deviation-2" in enabled(crew.job_id)


def test_an_invalid_row_is_logged_once_per_content_of_the_rows(crew, caplog):
    Rule.objects.filter(team=None, key="loss-rising").update(params={"windows": 0})
    with caplog.at_level(logging.ERROR, logger=rules_module.__name__):
        for _ in range(3):
            assert "loss-rising" not in enabled(crew.job_id)
    logged = [r for r in caplog.records if "loss-rising" in r.getMessage()]
    assert len(logged) == 1
