"""POST /api/v1/agent/snapshots: what the SDK sends is stored; anything else is refused whole."""

from __future__ import annotations

import json

import pytest

from brakeline.snapshot import take_snapshot
from breakers.models import EnvironmentSnapshot
from breakers.snapshots.intake import MAX_SNAPSHOT_BYTES, record_snapshot
from core.errors import PayloadTooLarge

pytestmark = pytest.mark.django_db

URL = "/api/v1/agent/snapshots"
SHA = "ab" * 32
ENVIRONMENT = {
    "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123",
    "WANDB_API_KEY": "0123456789abcdef",
    "HF_ENDPOINT": "https://user:s3cr3t@mirror.internal/hf",
    "TOKENIZERS_PARALLELISM": "false",
    "CUDA_VISIBLE_DEVICES": "0",
}


def sdk_snapshot() -> dict:
    """Exactly what the SDK builds, secrets in the environment included (it redacts them)."""
    return json.loads(json.dumps(take_snapshot(seeds={"torch": 7}, environ=ENVIRONMENT)))


def body(kind: str = "start", step: int = 0, **extra) -> dict:
    return {"kind": kind, "step": step, "snapshot": sdk_snapshot(), **extra}


def test_a_start_snapshot_from_the_sdk_is_stored_and_a_retry_is_the_same_row(agent, agent_post):
    sent = body()
    response = agent_post(URL, sent)
    assert response.status_code == 201, response.content
    answer = response.json()
    assert answer["kind"] == "start" and answer["step"] == 0 and answer["created"] is True
    row = EnvironmentSnapshot.objects.get(pk=answer["id"])
    assert row.job_id == agent.job_id and row.kind == "start" and row.checkpoint_path == ""
    assert row.data["environment"]["HF_TOKEN"] == "<redacted>"
    assert row.data["environment"]["TOKENIZERS_PARALLELISM"] == "false"
    assert row.data["seeds"] == {"torch": 7}
    assert row.taken_at.isoformat() == sent["snapshot"]["taken_at"]
    again = agent_post(URL, sent)  # the agent did not get the answer and retries
    assert again.status_code == 200 and again.json()["id"] == row.pk
    assert EnvironmentSnapshot.objects.count() == 1


def test_a_checkpoint_snapshot_records_the_checkpoint(agent, agent_post):
    checkpoint = {"path": "/ckpt/step-00000040.pt", "sha256": SHA, "bytes": 1234}
    response = agent_post(URL, body("checkpoint", 40, checkpoint=checkpoint))
    assert response.status_code == 201, response.content
    row = EnvironmentSnapshot.objects.get(pk=response.json()["id"])
    assert (row.kind, row.step, row.checkpoint_path, row.checkpoint_sha256) == (
        "checkpoint",
        40,
        "/ckpt/step-00000040.pt",
        SHA,
    )


def nested(levels: int) -> list:
    value: list = [1]
    for _ in range(levels - 1):
        value = [value]
    return value


def _with_snapshot(**changes) -> dict:
    sent = body()
    sent["snapshot"].update(changes)
    return sent


BAD_BODIES = {
    "not JSON": (b"{nope", "malformed_json", None),
    "an array": (b"[]", "malformed_json", None),
    "bare NaN": (b'{"kind": "start", "step": 1, "snapshot": {"x": NaN}}', "malformed_json", None),
    "no kind": ({"step": 0, "snapshot": {}}, "invalid", "kind"),
    "unknown kind": ({"kind": "later", "step": 0, "snapshot": {}}, "invalid", "kind"),
    "negative step": ({"kind": "start", "step": -1, "snapshot": {}}, "invalid", "step"),
    "step as text": ({"kind": "start", "step": "3", "snapshot": {}}, "invalid", "step"),
    "step true": ({"kind": "start", "step": True, "snapshot": {}}, "invalid", "step"),
    "no snapshot": ({"kind": "start", "step": 0}, "invalid", "snapshot"),
    "snapshot list": ({"kind": "start", "step": 0, "snapshot": []}, "invalid", "snapshot"),
    "unknown field": ({"kind": "start", "step": 0, "snapshot": {}, "x": 1}, "invalid", "x"),
    "packages list": (_with_snapshot(packages=["torch"]), "invalid", "snapshot.packages"),
    "env number": (
        _with_snapshot(environment={"OMP_NUM_THREADS": 4}),
        "invalid",
        "snapshot.environment",
    ),
    "naive time": (_with_snapshot(taken_at="2026-01-01T00:00:00"), "invalid", "snapshot.taken_at"),
    "schema true": (_with_snapshot(schema=True), "invalid", "snapshot.schema"),
    "checkpoint at start": (
        body(checkpoint={"path": "/c", "sha256": SHA}),
        "invalid",
        "checkpoint",
    ),
    "checkpoint missing": (body("checkpoint", 4), "invalid", "checkpoint"),
    "bad sha256": (
        body("checkpoint", 4, checkpoint={"path": "/c", "sha256": "AB" * 32}),
        "invalid",
        "checkpoint.sha256",
    ),
    "empty path": (
        body("checkpoint", 4, checkpoint={"path": "", "sha256": SHA}),
        "invalid",
        "checkpoint.path",
    ),
    "too deep": (
        {"kind": "start", "step": 0, "snapshot": {"a": nested(17)}},
        "invalid",
        "snapshot",
    ),
}


@pytest.mark.parametrize("name", list(BAD_BODIES))
def test_bad_bodies_are_refused_in_the_spec_error_format(agent_post, name):
    sent, code, field = BAD_BODIES[name]
    response = agent_post(URL, sent)
    assert response.status_code == 400, response.content
    error = response.json()
    assert error["error"] == code and error["detail"]
    if field is not None:
        assert field in error["fields"], error["fields"]
    assert not EnvironmentSnapshot.objects.exists()


@pytest.mark.parametrize(
    "where, value",
    [
        (("environment", "HF_TOKEN"), "hf_abcdefghijklmnopqrstuvwxyz0123"),
        (("environment", "PGPASSWORD"), "hunter2"),
        (("environment", "HF_ENDPOINT"), "https://user:hunter2@mirror.internal/hf"),
        (("custom", "client_secret"), "hunter2"),
        (("custom", "ssh_keys"), "hunter2"),
    ],
)
def test_a_secret_sent_in_clear_is_refused_and_never_echoed(agent_post, where, value):
    sent = body()
    sent["snapshot"].setdefault(where[0], {})[where[1]] = value
    response = agent_post(URL, sent)
    assert response.status_code == 400
    error = response.json()
    assert error["error"] == "unredacted_secret"
    assert list(error["fields"]) == [f"snapshot.{where[0]}.{where[1]}"]
    assert b"hunter2" not in response.content and b"hf_abc" not in response.content
    assert not EnvironmentSnapshot.objects.exists()


def test_names_that_only_look_secret_and_redacted_values_are_accepted(agent_post):
    sent = body()
    sent["snapshot"]["environment"].update(
        {"TOKENIZERS_PARALLELISM": "true", "BRAKELINE_TOKEN": "<redacted>", "KEY_SIZE": ""}
    )
    sent["snapshot"]["packages"]["keyring"] = "25.0"  # a package name, not a key
    sent["snapshot"]["custom"] = {"max_tokens": 4096, "keyboard": "us"}
    assert agent_post(URL, sent).status_code == 201


def test_a_snapshot_over_the_size_limit_is_413_and_nothing_is_stored(agent, agent_post):
    sent = body()
    sent["snapshot"]["padding"] = "x" * MAX_SNAPSHOT_BYTES
    response = agent_post(URL, sent)
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"
    # Without a Content-Length to refuse early, the service checks the size it read.
    with pytest.raises(PayloadTooLarge):
        record_snapshot(agent.job_id, json.dumps(sent).encode())
    assert not EnvironmentSnapshot.objects.exists()


def test_no_token_is_401(agent_post):
    response = agent_post(URL, body(), token="")
    assert response.status_code == 401 and response.json()["error"] == "missing_token"


def test_the_schema_documents_the_endpoint(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    operation = schema["paths"]["/api/v1/agent/snapshots"]["post"]
    assert set(operation["responses"]) >= {"201", "400", "401", "413", "429"}
