"""The incident timeline is append-only: the model, its queryset and PostgreSQL all refuse."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import IntegrityError, connection, transaction

from core.append_only import AppendOnlyError
from incidents.alerts.lifecycle import append_timeline
from incidents.models import Incident, TimelineEntry, TimelineKind

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def entry(agent) -> TimelineEntry:
    incident = Incident.objects.create(
        job_id=agent.job_id, title="t", level="L1", opened_at=T0, first_step=1, first_time=T0
    )
    return append_timeline(incident.pk, TimelineKind.NOTE, "original", at=T0, step=1)


def test_appending_works_and_rows_come_back_in_time_order(entry):
    later = append_timeline(entry.incident_id, TimelineKind.NOTE, "later")
    earlier = append_timeline(
        entry.incident_id, TimelineKind.NOTE, "earlier", at=T0.replace(year=2025)
    )
    assert list(TimelineEntry.objects.filter(incident_id=entry.incident_id)) == [
        earlier,
        entry,
        later,
    ]


def test_the_model_refuses_to_save_an_existing_row_or_delete_one(entry):
    entry.message = "rewritten"
    with pytest.raises(AppendOnlyError):
        entry.save()
    with pytest.raises(AppendOnlyError):
        entry.delete()
    entry.refresh_from_db()
    assert entry.message == "original"


@pytest.mark.parametrize(
    "change",
    [
        lambda qs: qs.update(message="rewritten"),
        lambda qs: qs.delete(),
        lambda qs: TimelineEntry.objects.bulk_update(list(qs), ["message"]),
        lambda qs: qs.first().incident.timeline.all().delete(),
    ],
    ids=["update", "delete", "bulk_update", "related_manager_delete"],
)
def test_the_queryset_refuses_updates_and_deletes(entry, change):
    with pytest.raises(AppendOnlyError):
        change(TimelineEntry.objects.filter(pk=entry.pk))
    assert TimelineEntry.objects.get(pk=entry.pk).message == "original"


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE incidents_timelineentry SET message = 'rewritten' WHERE id = %s",
        "DELETE FROM incidents_timelineentry WHERE id = %s",
    ],
    ids=["UPDATE", "DELETE"],
)
def test_postgresql_rejects_raw_sql_updates_and_deletes(entry, sql):
    assert connection.vendor == "postgresql"
    with (
        pytest.raises(IntegrityError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, [entry.pk])
    assert TimelineEntry.objects.get(pk=entry.pk).message == "original"


def test_the_incident_cannot_be_deleted_from_under_its_timeline(entry):
    from django.db.models import ProtectedError

    with pytest.raises(ProtectedError):
        Incident.objects.filter(pk=entry.incident_id).delete()
