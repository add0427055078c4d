"""Shared pieces of the authorisation-chain tests: people with roles, alerts, an API client.

The ``scene`` fixture (a plugin: name it as a parameter) is ``make_scene()``.
Users are created without passwords (no hashing: the matrix makes hundreds of them) and act
through personal tokens, or ``force_login`` where a browser session is the point.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

if TYPE_CHECKING:
    from incidents.models import Alert, Team

ROLES = ("viewer", "oncall", "manager", "admin")
LEVELS = (None, "L1", "L2", "L3", "L4")
T0 = datetime(2026, 1, 1, tzinfo=UTC)

_names = itertools.count(1)


def make_user(prefix: str = "user") -> Any:
    return get_user_model().objects.create(username=f"{prefix}-{next(_names)}")


def make_member(team: Team, role: str | None, prefix: str | None = None) -> Any:
    from incidents.models import Membership

    user = make_user(prefix or role or "outsider")
    if role is not None:
        Membership.objects.create(user=user, team=team, role=role)
    return user


def raise_alert(job_id: int, severity: str, *, rule_key: str | None = None) -> Alert:
    """A stability alert of ``severity`` on the job (opens or joins its incident)."""
    from incidents.alerts.lifecycle import AlertSignal, raise_or_update_alert

    signal = AlertSignal(
        rule_key=rule_key or f"rule-{severity}-{next(_names)}",
        rule_name=f"Test rule {severity}",
        layer="stability",
        severity=severity,
        metric="loss",
        node="",
        value=9.5,
        threshold=4.0,
        description=f"loss 9.5 above 4.0 ({severity})",
        step=100,
        time=T0,
        first_step=90,
        first_time=T0 - timedelta(seconds=10),
        action="none",
    )
    return raise_or_update_alert(job_id, signal).alert


class Api:
    """A person's script: JSON over the test client with their personal token."""

    def __init__(self, user: Any, client: Client | None = None):
        from incidents.models import PersonalToken

        self.user = user
        self.token = PersonalToken.issue(user, "tests")[1]
        self.client = client or Client()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Token {self.token}", "User-Agent": "authz-tests/1.0"}

    def get(self, path: str, **params: Any):
        return self.client.get(path, params, headers=self.headers)

    def post(self, path: str, body: dict[str, Any] | None = None):
        return self.client.post(
            path, json.dumps(body or {}), content_type="application/json", headers=self.headers
        )

    def put(self, path: str, body: dict[str, Any] | None = None):
        return self.client.put(
            path, json.dumps(body or {}), content_type="application/json", headers=self.headers
        )

    def delete(self, path: str):
        return self.client.delete(path, headers=self.headers)


@dataclass
class Scene:
    """One team with a job and one person per role, and a stranger from another team."""

    team: Team
    job_id: int
    agent_token: str
    people: dict[str, Any] = field(default_factory=dict)

    def person(self, role: str | None) -> Any:
        """The member with ``role`` (None: a member of another team only), made on demand."""
        from incidents.models import Team

        if role not in self.people:
            if role is None:
                other = Team.objects.get_or_create(name="elsewhere")[0]
                self.people[None] = make_member(other, "admin", prefix="stranger")
            else:
                self.people[role] = make_member(self.team, role)
        return self.people[role]

    def extra(self, name: str, role: str) -> Any:
        """Another member of the team (a requester, the person put on call), by name."""
        if name not in self.people:
            self.people[name] = make_member(self.team, role, prefix=name)
        return self.people[name]

    def api(self, role: str | None) -> Api:
        return Api(self.person(role))

    @property
    def agent_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.agent_token}"}


def make_scene() -> Scene:
    from incidents.jobs import create_job

    created = create_job("research", f"llm-{next(_names)}")
    return Scene(team=created.job.team, job_id=created.job.pk, agent_token=created.raw_token)


@pytest.fixture
def scene(db) -> Scene:
    """A team with a job and a person per role (the authorisation-chain tests)."""
    return make_scene()
