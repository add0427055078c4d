"""Fixtures of the fire drills (a plugin: name them as parameters): a real beat (the
watchdog), and ``drill_team``, the team ``research`` with its people, its on-call shift and its
policy's endpoints (the receiver stands in for the chat webhook and the SMS/phone provider);
and ``drill()``, which runs ``manage.py drill`` for that team (import it)."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from tests.support.beat import running_beat

# A drill end to end against the real stack: committed transactions (the worker, the beat and
# Daphne see the rows), the beat's watchdog running.
END_TO_END_MARKS = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("watchdog_beat"),
]
# The scorecard's lines, in order, of every drill; then those of a drill of the recovery path.
SCORECARD_LINES = [
    "breaker fired",
    "time to detect",
    "time to brake",
    "checkpoint saved",
    "checkpoint loads",
    "checkpoint before the anomaly",
    "release",
    "paged",
    "timeline complete",
]
RECOVERY_LINES = ["verdict recorded", "rolled back", "step skipped", "resumed", "time to recover"]


@pytest.fixture
def watchdog_beat(worker):
    """Celery beat as in production: the watchdog tick every second, on the test queues."""
    with running_beat() as process:
        yield process


@pytest.fixture
def drill_team(receiver, settings, tmp_path) -> Any:
    """The team drilled: an admin, alice on call (phone), bob the manager, the chat webhook."""
    from django.contrib.auth import get_user_model

    from incidents.models import Contact, Membership, NotificationPolicy, OnCallShift, Team

    settings.NOTIFY_PROVIDER_BASE_URL = receiver.url + "/2010-04-01/Accounts/AC1"
    settings.NOTIFY_PROVIDER_ACCOUNT_SID = "AC1"
    settings.NOTIFY_PROVIDER_AUTH_TOKEN = "secret"
    settings.NOTIFY_PROVIDER_FROM_NUMBER = "+15550000000"
    settings.DRILL_DIR = tmp_path / "drills"
    team, _ = Team.objects.get_or_create(name="research")
    users = get_user_model().objects
    admin = users.create_user(username="ada", email="ada@example.org", password="pw-for-tests")
    alice = users.create(username="alice", email="alice@example.org")
    bob = users.create(username="bob", email="bob@example.org")
    for user, role in ((admin, "admin"), (alice, "oncall"), (bob, "manager")):
        Membership.objects.create(user=user, team=team, role=role)
    Contact.objects.create(user=alice, phone="+15551110001")
    now = datetime.now(UTC)
    OnCallShift.objects.create(
        team=team, user=alice, starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=8)
    )
    NotificationPolicy.objects.update_or_create(
        team=team, defaults={"chat_webhook_url": receiver.url + "/hooks/chat"}
    )
    return team


def drill(live_console: str, *arguments: str) -> tuple[str, int]:
    """``manage.py drill`` for ``drill_team`` against the live console, to its end: what it
    printed and its exit code (0 when every line passed)."""
    out = io.StringIO()
    try:
        call_command(
            "drill", "--team", "research", "--console-url", live_console, *arguments, stdout=out
        )
        return out.getvalue(), 0
    except CommandError as error:
        return out.getvalue(), error.returncode
