"""Finding 3: with DEBUG on the secret-key refusal was skipped (the public development key)
and a one-character key was accepted; `check --deploy` warned about cookies, HSTS & co."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SERVER = {
    "DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/x",
    "REDIS_URL": "redis://127.0.0.1:6379/3",
}
GOOD_KEY = "Zq8-3vN_kP1xR7tL0wY5bH2mC9dF4gJ6sA-eU_iO8nT3rW1yQ7"


def run(tmp_path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("BRAKELINE_")
        # The browser tests' conftest sets DJANGO_ALLOW_ASYNC_UNSAFE for the test process only.
        and k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_ALLOW_ASYNC_UNSAFE"}
    }
    clean.update(BRAKELINE_DATA_DIR=str(tmp_path), **env)
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=120
    )


PROBE = [
    "-c",
    "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'config.settings'; "
    "django.setup(); from django.conf import settings as s; print(s.SECRET_KEY)",
]


@pytest.mark.parametrize(
    "env, sentence",
    [
        ({"BRAKELINE_DEBUG": "true"}, "BRAKELINE_SECRET_KEY is not set"),
        ({"BRAKELINE_DEBUG": "false"}, "BRAKELINE_SECRET_KEY is not set"),
        ({"BRAKELINE_SECRET_KEY": "k"}, "BRAKELINE_SECRET_KEY is too short"),
        ({"BRAKELINE_SECRET_KEY": "k", "BRAKELINE_DEBUG": "true"}, "is too short"),
        ({"BRAKELINE_SECRET_KEY": "a" * 31}, "is too short: 31 characters"),
        ({"BRAKELINE_SECRET_KEY": "ab" * 30}, "is too simple: fewer than 5 different"),
    ],
)
def test_the_server_mode_refuses_a_missing_or_short_key_whatever_debug_says(
    tmp_path, env, sentence
):
    result = run(tmp_path, PROBE, **SERVER, **env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and sentence in result.stderr


def test_a_long_key_is_taken_and_the_embedded_mode_needs_none(tmp_path):
    result = run(tmp_path, PROBE, **SERVER, BRAKELINE_SECRET_KEY=GOOD_KEY)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == GOOD_KEY
    assert run(tmp_path, PROBE).returncode == 0


@pytest.mark.parametrize(
    "tls", [{"BRAKELINE_SECURE": "true"}, {"BRAKELINE_TLS_PROXY": "true"}], ids=["tls", "proxy"]
)
def test_check_deploy_with_production_settings_prints_no_warning(tmp_path, tls):
    result = run(
        tmp_path,
        ["manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        **SERVER,
        **tls,
        BRAKELINE_SECRET_KEY=GOOD_KEY,
        BRAKELINE_DEBUG="false",
        BRAKELINE_ALLOWED_HOSTS="brakeline.example.org",
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output and "System check identified no issues" in output


def test_the_pages_answer_with_the_security_headers(admin_client):
    response = admin_client.get("/login/")
    policy = response["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "'unsafe-inline'" not in policy.split("script-src", 1)[1].split(";", 1)[0]
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"


def test_no_template_has_an_inline_script_or_handler():
    import re

    for template in (ROOT / "templates").rglob("*.html"):
        html = template.read_text()
        assert not re.search(r"\son[a-z]+=", html), template
        for tag in re.findall(r"<script\b[^>]*>", html):
            assert "src=" in tag or 'type="application/json"' in tag, (template, tag)
