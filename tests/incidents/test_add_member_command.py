"""manage.py add_member: roles given by a documented command, through the add_member service."""

from __future__ import annotations

import io
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from incidents.models import AuditEntry, Membership, Team
from incidents.teams.authority import Action

pytestmark = pytest.mark.django_db

COMMAND = "incidents.management.commands.add_member"


def run(*args: str) -> list[str]:
    out = StringIO()
    call_command("add_member", *args, stdout=out)
    return out.getvalue().strip().splitlines()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def typed(monkeypatch):
    """A person at a terminal typing these answers to the password prompts."""

    def answers(*passwords: str) -> list[str]:
        prompts: list[str] = []
        replies = iter(passwords)
        monkeypatch.setattr("sys.stdin", Terminal())
        monkeypatch.setattr(f"{COMMAND}.getpass", lambda p: prompts.append(p) or next(replies))
        return prompts

    return answers


def test_a_new_user_in_a_new_team_with_the_password_from_the_environment(monkeypatch):
    monkeypatch.setenv("ANA_PASSWORD", "correct horse battery")
    lines = run(
        "--team", "vision", "--user", "ana", "--role", "oncall", "--password-env", "ANA_PASSWORD"
    )
    assert lines == [
        "Created team 'vision'.",
        "Created user 'ana'.",
        "'ana' is now oncall of 'vision'.",
    ]
    ana = get_user_model().objects.get(username="ana")
    assert ana.check_password("correct horse battery")
    assert Membership.objects.get(user=ana).role == "oncall"
    entry = AuditEntry.objects.get(action=Action.MANAGE_MEMBERS)
    assert (entry.via, entry.allowed, entry.outcome_code) == ("command", True, "ok")
    assert entry.team == Team.objects.get(name="vision") and entry.user is None


def test_interactive_the_password_is_asked_twice(typed):
    prompts = typed("s3cret-pass", "s3cret-pass")
    run("--team", "vision", "--user", "bo", "--role", "viewer")
    assert len(prompts) == 2 and "bo" in prompts[0]
    assert get_user_model().objects.get(username="bo").check_password("s3cret-pass")


def test_two_different_passwords_change_nothing(typed):
    typed("s3cret-pass", "s3cret-typo")
    with pytest.raises(CommandError, match="differ"):
        run("--team", "vision", "--user", "bo", "--role", "viewer")
    assert not get_user_model().objects.exists() and not Team.objects.exists()


def test_an_existing_member_changes_role_and_keeps_the_password(typed):
    user = get_user_model().objects.create_user("cy", password="the-old-one")
    team = Team.objects.create(name="vision")
    Membership.objects.create(user=user, team=team, role="viewer")
    prompts = typed()
    lines = run("--team", "vision", "--user", "cy", "--role", "manager")
    assert prompts == [] and lines == ["'cy' is now manager of 'vision' (was viewer)."]
    assert Membership.objects.get(user=user, team=team).role == "manager"
    user.refresh_from_db()
    assert user.check_password("the-old-one")


def test_a_new_user_without_terminal_or_variable_is_refused(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO())
    with pytest.raises(CommandError, match="--password-env"):
        run("--team", "vision", "--user", "di", "--role", "viewer")
    with pytest.raises(CommandError, match="NO_SUCH_VAR: that variable is not set"):
        run("--team", "vision", "--user", "di", "--role", "viewer", "--password-env", "NO_SUCH_VAR")
    assert not get_user_model().objects.exists()


def test_a_weak_password_is_refused_and_audited(monkeypatch):
    monkeypatch.setenv("WEAK", "short")
    with pytest.raises(CommandError, match="password is refused.*too short"):
        run("--team", "vision", "--user", "ed", "--role", "viewer", "--password-env", "WEAK")
    assert not get_user_model().objects.exists() and not Team.objects.exists()
    entry = AuditEntry.objects.get(action=Action.MANAGE_MEMBERS)
    assert entry.outcome_code == "invalid" and entry.team is None


def test_an_unknown_role_is_refused_by_the_parser():
    with pytest.raises(CommandError, match="invalid choice: 'owner'"):
        run("--team", "vision", "--user", "ed", "--role", "owner")
