"""The suite's flush between transactional tests (tests/support/flush.py) leaves every table
Django would truncate empty: plain tables, the append-only ones whose triggers refuse a
DELETE, a table of many rows, and the tables pointing at them."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.core.management.color import no_style
from django.core.management.sql import sql_flush
from django.db import connection

from tests.support.authz import raise_alert
from tests.support.flush import KEPT, MANY_ROWS, empty_tables


def _rows_by_table() -> dict[str, int]:
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    with connection.cursor() as cursor:
        counts = {}
        for table in tables:
            cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
            counts[table] = cursor.fetchone()[0]
    return counts


@pytest.mark.django_db(transaction=True)
def test_the_flush_empties_every_table_the_append_only_and_the_large_ones_too(make_agent):
    raise_alert(make_agent().job_id, "L3")  # an incident and its (append-only) timeline
    users = get_user_model().objects
    users.bulk_create(users.model(username=f"many-{n}") for n in range(MANY_ROWS + 1))
    before = _rows_by_table()
    assert before["incidents_timelineentry"] and before["auth_user"] > MANY_ROWS

    empty_tables(connection.ops, sql_flush(no_style(), connection, reset_sequences=False))

    after = _rows_by_table()
    assert {table: n for table, n in after.items() if n and table not in KEPT} == {}
    assert after["django_content_type"] == before["django_content_type"] > 0
    assert ContentType.objects.get_for_model(users.model).model == "user"
