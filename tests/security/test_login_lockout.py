"""Finding 2: 200 wrong passwords at ~4/s met no delay and no lock-out. Now django-axes
counts failures (the login page and the admin): past the limit the right password is refused
too, until the cool-off has passed (time travel, no sleeping). The lock is per user (from one
address, and across addresses), never per address alone: ten wrong passwords of one user once
locked every user behind the same reverse proxy."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.test import Client

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
PASSWORD = "correct horse battery staple"


@pytest.fixture
def person(db):
    return get_user_model().objects.create_user("ana", password=PASSWORD, is_staff=True)


def sign_in(client: Client, path: str, password: str, *, ip: str = "203.0.113.7"):
    return client.post(path, {"username": "ana", "password": password}, REMOTE_ADDR=ip)


@pytest.mark.parametrize("path", ["/login/", "/admin/login/"])
def test_failures_lock_the_account_until_the_cool_off(person, settings, path):
    limit = settings.AXES_FAILURE_LIMIT
    cool_off = settings.AXES_COOLOFF_TIME
    with time_machine.travel(T0, tick=False) as clock:
        client = Client()
        for _ in range(limit - 1):
            assert sign_in(client, path, "wrong").status_code == 200  # the form again
        assert sign_in(client, path, "wrong").status_code == 429  # the limit-th failure locks
        response = sign_in(client, path, PASSWORD)
        assert response.status_code == 429, "the right password is refused while locked"
        assert "_auth_user_id" not in client.session
        # Another address, same account: still locked (the account is the target).
        assert sign_in(Client(), path, PASSWORD, ip="198.51.100.9").status_code == 429
        clock.shift(cool_off - timedelta(seconds=5))
        assert sign_in(client, path, PASSWORD).status_code == 429
        clock.shift(timedelta(seconds=10))
        response = sign_in(client, path, PASSWORD)
        assert response.status_code == 302, response.content[:300]
        assert client.session["_auth_user_id"] == str(person.pk)


def test_one_users_failures_never_lock_the_others_behind_the_same_address(person, settings):
    """Behind a reverse proxy one address is every user: ana's ten wrong passwords lock ana
    (from every address), never bo, on call, from the same one."""
    get_user_model().objects.create_user("bo", password=PASSWORD)
    proxy = "203.0.113.8"
    with time_machine.travel(T0, tick=False):
        client = Client()
        for _ in range(settings.AXES_FAILURE_LIMIT):
            sign_in(client, "/login/", "wrong", ip=proxy)
        assert sign_in(Client(), "/login/", PASSWORD, ip=proxy).status_code == 429  # ana
        bo = Client().post("/login/", {"username": "bo", "password": PASSWORD}, REMOTE_ADDR=proxy)
        assert bo.status_code == 302


def test_guessing_many_names_from_one_address_locks_none_of_them(person, settings):
    with time_machine.travel(T0, tick=False):
        client = Client()
        for n in range(settings.AXES_FAILURE_LIMIT * 2):
            client.post(
                "/login/", {"username": f"guess-{n}", "password": "x"}, REMOTE_ADDR="203.0.113.9"
            )
        assert sign_in(Client(), "/login/", PASSWORD, ip="203.0.113.9").status_code == 302


def test_a_success_below_the_limit_resets_the_count(person, settings):
    with time_machine.travel(T0, tick=False):
        client = Client()
        for _ in range(settings.AXES_FAILURE_LIMIT - 1):
            sign_in(client, "/login/", "wrong")
        assert sign_in(client, "/login/", PASSWORD).status_code == 302
        client = Client()
        for _ in range(settings.AXES_FAILURE_LIMIT - 1):
            assert sign_in(client, "/login/", "wrong").status_code == 200
