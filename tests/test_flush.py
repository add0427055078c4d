"""The suite's flush between transactional tests (tests/support/flush.py) leaves every table
Django would truncate empty: plain tables, the append-only ones whose triggers refuse a
DELETE, a table of many rows, and the tables pointing at them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.core.management.color import no_style
from django.core.management.sql import sql_flush
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from breakers.control.hearing import ROW
from breakers.models import Hearing, WebBeacon
from tests.support.authz import raise_alert
from tests.support.flush import KEPT, MANY_ROWS, empty_tables

# The suite's live console (a web process for the whole session, tests/conftest.py) writes the
# hearing beacon's two tables twice a second: also between the flush and the count below. In
# these, the rows the test wrote must be gone; a live process's next beacon may be there.
BEACON_TABLES = frozenset({"breakers_hearing", "breakers_webbeacon"})
# No beacon writes this many outages or this process name.
MARK = 987_654
GONE_PROCESS = "flush-test:0:gone"


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
    _write_the_beacon_tables()
    before = _rows_by_table()
    assert before["incidents_timelineentry"] and before["auth_user"] > MANY_ROWS

    empty_tables(connection.ops, sql_flush(no_style(), connection, reset_sequences=False))

    after = _rows_by_table()
    left = {table: n for table, n in after.items() if n and table not in KEPT | BEACON_TABLES}
    assert left == {}
    assert not Hearing.objects.filter(outages__gte=MARK).exists()
    assert not WebBeacon.objects.filter(pk=GONE_PROCESS).exists()
    assert after["django_content_type"] == before["django_content_type"] > 0
    assert ContentType.objects.get_for_model(users.model).model == "user"


def _write_the_beacon_tables() -> None:
    """Beacon rows no live process will write again: a marked hearing, a process of its own
    (beating in the future: no beacon buries it as dead before the flush)."""
    far = timezone.now() + timedelta(days=365)
    Hearing.objects.update_or_create(
        pk=ROW, defaults={"heard_at": Now(), "heard_since": Now(), "outages": MARK}
    )
    WebBeacon.objects.create(process=GONE_PROCESS, beat_at=far, heard_to=far)
