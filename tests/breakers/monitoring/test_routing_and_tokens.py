"""Which node an alert names, and the team's integration token from manage.py."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from breakers.monitoring.receiver import authenticate_integration
from breakers.monitoring.routing import node_of
from incidents.models import AuditEntry, Team


@pytest.mark.parametrize(
    ("labels", "node"),
    [
        ({"Hostname": "gpu-b", "instance": "10.0.0.2:9400"}, "gpu-b"),
        ({"brakeline_node": "gpu-c", "Hostname": "gpu-b"}, "gpu-c"),
        ({"node": "k8s-node-1", "instance": "x:1"}, "k8s-node-1"),
        ({"instance": "gpu-d.cluster:9400"}, "gpu-d.cluster"),
        ({"instance": "[::1]:9400"}, "::1"),
        ({"instance": "gpu-e"}, "gpu-e"),
        ({"Hostname": "gpu[001-512]", "instance": "gpu-f:9400"}, "gpu-f"),  # never a host list
        ({"Hostname": "a,b"}, ""),
        ({"Hostname": "x" * 201}, ""),
        ({"Hostname": "   "}, ""),
        ({}, ""),
    ],
)
def test_node_of(labels, node):
    assert node_of(labels) == node


@pytest.mark.django_db
def test_manage_py_issues_a_team_token_shown_once():
    team = Team.objects.create(name="research")
    out = io.StringIO()
    call_command("integration_token", "research", stdout=out)
    raw = out.getvalue().strip()
    assert raw.startswith("bki_") and authenticate_integration(raw) == team
    assert team.integration_tokens.get().token_hash != raw
    with pytest.raises(CommandError):
        call_command("integration_token", "nobody")


@pytest.mark.django_db
def test_team_admins_issue_and_revoke_tokens_over_the_api(scene):
    admin, manager, stranger = scene.api("admin"), scene.api("manager"), scene.api(None)
    path = f"/api/v1/teams/{scene.team.pk}/integration-tokens"
    assert manager.post(path, {"name": "alertmanager"}).status_code == 403
    assert stranger.post(path, {"name": "alertmanager"}).status_code == 404
    assert admin.post(path, {"name": ""}).status_code == 400
    issued = admin.post(path, {"name": "alertmanager"})
    assert issued.status_code == 201, issued.content
    raw = issued.json()["token"]
    assert authenticate_integration(raw) == scene.team
    token_path = f"/api/v1/integration-tokens/{issued.json()['id']}"
    assert manager.delete(token_path).status_code == 403
    assert stranger.delete(token_path).status_code == 404
    assert admin.delete(token_path).status_code == 200
    assert admin.delete(token_path).status_code == 200  # twice is harmless
    with pytest.raises(Exception, match="revoked"):
        authenticate_integration(raw)
    audit = AuditEntry.objects.filter(action="manage_notifications")
    assert audit.filter(allowed=False).count() == 4  # the refusals are on the audit trail too
    assert audit.filter(outcome_code="ok").count() == 3
