"""manage.py create_job: creates the job (and team), prints the token last, stores it hashed."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from incidents.agent_tokens import authenticate_agent
from incidents.models import AgentToken, Job, Team, hash_token

pytestmark = pytest.mark.django_db


def run(*args: str) -> list[str]:
    out = StringIO()
    call_command("create_job", *args, stdout=out)
    return out.getvalue().strip().splitlines()


def test_creates_team_and_job_and_prints_the_token_on_the_last_line():
    lines = run("--team", "vision", "--name", "vit-huge")
    token = lines[-1]
    assert token.startswith("bkl_") and len(token) > 40
    job = Job.objects.get(team__name="vision", name="vit-huge")
    assert job.kind == "training"
    assert authenticate_agent(token) == job
    stored = AgentToken.objects.get(job=job)
    assert stored.token_hash == hash_token(token) and token not in stored.token_hash
    assert stored.prefix == token[:12]


def test_existing_team_is_reused_and_kind_is_taken():
    Team.objects.create(name="serving")
    lines = run("--team", "serving", "--name", "llm-api", "--kind", "inference")
    assert not any("Created team" in line for line in lines)
    assert Job.objects.get(name="llm-api").kind == "inference"
    assert Team.objects.filter(name="serving").count() == 1


def test_duplicate_job_name_in_a_team_is_refused_clearly():
    run("--team", "vision", "--name", "vit")
    with pytest.raises(CommandError, match="already has a job named 'vit'"):
        run("--team", "vision", "--name", "vit")
    assert Job.objects.count() == 1


def test_empty_names_are_refused():
    with pytest.raises(CommandError, match="name must not be empty"):
        run("--team", "vision", "--name", "  ")
    assert not Job.objects.exists()


def test_each_job_gets_a_distinct_token():
    first, second = run("--team", "t", "--name", "a")[-1], run("--team", "t", "--name", "b")[-1]
    assert first != second
    assert authenticate_agent(first).name == "a" and authenticate_agent(second).name == "b"
