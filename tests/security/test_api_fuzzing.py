"""The API against its own OpenAPI schema: schemathesis generates requests (valid and invalid
ones) for every person endpoint (with a personal token) and every agent endpoint (with the
job's agent token), sent to the real Daphne, and not one of them may be answered by a server
error. Bounded: a few examples per operation."""

from __future__ import annotations

import contextlib
import time

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES_PER_OPERATION = 12
TIME_BUDGET_SECONDS = 240.0
# Not the people API (agents, the provider's receipts, the health probe), or a call that would
# take the token away from the run (tokens are managed from a session only anyway).
SKIPPED = ("/api/v1/agent/", "/api/v1/notifications/receipts", "/api/v1/health", "/api/v1/tokens")


# Fuzzed first, whatever the time budget leaves for the rest: the declarations of what is a
# job's (docs/security.md).
FIRST = (
    "/api/v1/jobs/{id}/inference-servers",
    "/api/v1/jobs/{id}/checkpoint-root",
    "/api/v1/teams/{id}/checkpoint-root",
)


def fuzz(operation, base_url: str, headers: dict[str, str], failures: list[str], mode, sent):
    @given(case=operation.as_strategy(generation_mode=mode))
    @hypothesis_settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def probe(case):
        response = case.call(base_url=base_url, headers=headers, timeout=30)
        sent.append(response.status_code)
        if response.status_code >= 500:
            failures.append(
                f"{operation.method.upper()} {case.formatted_path} {case.query!r} "
                f"{str(case.body)[:120]!r} -> {response.status_code}"
            )

    return probe


def test_no_generated_request_gets_a_server_error(live_console, make_agent):
    from django.contrib.auth import get_user_model

    from incidents.models import Job, Membership, PersonalToken

    agent = make_agent(team="fuzz", name="fuzzed-job")
    team = Job.objects.get(pk=agent.job_id).team
    person = get_user_model().objects.create(username="fuzzer")
    Membership.objects.create(user=person, team=team, role="admin")
    token = PersonalToken.issue(person, "schemathesis")[1]
    headers = {"Authorization": f"Token {token}"}

    schema = schemathesis.openapi.from_url(f"{live_console}/api/schema/?format=json")
    failures: list[str] = []
    sent: list[int] = []
    started = time.monotonic()
    operations = sorted(
        (r.ok() for r in schema.get_all_operations()), key=lambda op: op.path not in FIRST
    )
    assert {op.path for op in operations} >= set(FIRST)
    for operation in operations:
        if operation.path.startswith(SKIPPED) or time.monotonic() - started > TIME_BUDGET_SECONDS:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            # Unsatisfiable: nothing to make invalid (an operation without parameters or body).
            with contextlib.suppress(Unsatisfiable):
                fuzz(operation, live_console, headers, failures, mode, sent)()
    assert failures == [], "\n".join(failures[:40])
    assert len(sent) > 200  # the run did reach the endpoints
    assert any(200 <= status < 300 for status in sent)


def test_no_generated_agent_request_gets_a_server_error(live_console, make_agent):
    """The agent protocol with the job's agent token: metrics, heartbeats, acks, snapshots."""
    agent = make_agent(team="fuzz", name="fuzzed-agent")
    headers = {"Authorization": f"Bearer {agent.token}"}
    schema = schemathesis.openapi.from_url(f"{live_console}/api/schema/?format=json")
    failures: list[str] = []
    sent: list[int] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if not operation.path.startswith("/api/v1/agent/"):
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            with contextlib.suppress(Unsatisfiable):
                fuzz(operation, live_console, headers, failures, mode, sent)()
    assert failures == [], "\n".join(failures[:40])
    assert len(sent) >= 4 * EXAMPLES_PER_OPERATION  # every agent endpoint was reached
    assert any(200 <= status < 300 for status in sent)
