"""The env-driven settings: embedded by default, server with both URLs, loud when half-set."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PROBE = (
    "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'config.settings'; django.setup();"
    "from django.conf import settings as s;"
    "print(s.EMBEDDED, s.DATABASES['default']['ENGINE'], s.CHANNEL_LAYERS['default']['BACKEND'],"
    " s.CELERY_TASK_ALWAYS_EAGER)"
)


def settings_probe(tmp_path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    clean.update(BRAKELINE_DATA_DIR=str(tmp_path), **env)
    clean.pop("BRAKELINE_SECRET_KEY", None) if "BRAKELINE_SECRET_KEY" not in env else None
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_nothing_set_is_the_embedded_mode(tmp_path):
    result = settings_probe(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "True",
        "django.db.backends.sqlite3",
        "channels.layers.InMemoryChannelLayer",
        "True",
    ]


def test_both_set_is_the_server_mode(tmp_path):
    result = settings_probe(
        tmp_path,
        DATABASE_URL="postgresql://postgres@127.0.0.1:5432/x",
        REDIS_URL="redis://127.0.0.1:6379/3",
        BRAKELINE_SECRET_KEY="k3y-Z" * 11,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "False",
        "django.db.backends.postgresql",
        "channels_redis.pubsub.RedisPubSubChannelLayer",
        "False",
    ]


@pytest.mark.parametrize(
    "env, sentence",
    [
        (
            {"DATABASE_URL": "postgresql://postgres@127.0.0.1/x"},
            "DATABASE_URL is set but REDIS_URL is not",
        ),
        ({"REDIS_URL": "redis://127.0.0.1:6379/0"}, "REDIS_URL is set but DATABASE_URL is not"),
        (
            {"DATABASE_URL": "mysql://root@127.0.0.1/x", "REDIS_URL": "redis://127.0.0.1:6379/0"},
            "DATABASE_URL must be a PostgreSQL URL",
        ),
        (
            {"DATABASE_URL": "postgresql://p@127.0.0.1/x", "REDIS_URL": "amqp://127.0.0.1"},
            "REDIS_URL must be a Redis URL",
        ),
        (
            {"DATABASE_URL": "postgresql://p@127.0.0.1/x", "REDIS_URL": "redis://127.0.0.1:6379/0"},
            "BRAKELINE_SECRET_KEY is not set",
        ),
        ({"BRAKELINE_DEBUG": "perhaps"}, "BRAKELINE_DEBUG='perhaps' is not a boolean"),
        (
            {"BRAKELINE_MAX_BATCH_POINTS": "lots"},
            "BRAKELINE_MAX_BATCH_POINTS='lots' is not a whole",
        ),
        (
            {"BRAKELINE_COMMAND_ACK_TIMEOUT_SECONDS": "checkpoint_and_pause=soon"},
            "BRAKELINE_COMMAND_ACK_TIMEOUT_SECONDS (checkpoint_and_pause)='soon' is not a number",
        ),
        (
            {"BRAKELINE_COMMAND_ACK_TIMEOUT_SECONDS": "pause=30"},
            "BRAKELINE_COMMAND_ACK_TIMEOUT_SECONDS: 'pause=30' is not kind=seconds",
        ),
        (
            {"BRAKELINE_EXECUTOR_GRACE_SECONDS": "-1"},
            "BRAKELINE_EXECUTOR_GRACE_SECONDS='-1' is not a number of seconds above 0",
        ),
        (
            {"BRAKELINE_HEARTBEAT_FLOOR_SECONDS": "ten"},
            "BRAKELINE_HEARTBEAT_FLOOR_SECONDS='ten' is not a number of seconds",
        ),
        (
            {"BRAKELINE_ESCALATION_DECISION_SECONDS": "0"},
            "BRAKELINE_ESCALATION_DECISION_SECONDS='0' is not a number of seconds above 0",
        ),
        (
            {"BRAKELINE_PUBLIC_URL": "brakeline.example.org"},
            "BRAKELINE_PUBLIC_URL='brakeline.example.org' is not an http:// or https:// URL",
        ),
        (
            {"BRAKELINE_NOTIFY_PROVIDER_URL": "api.twilio.com"},
            "BRAKELINE_NOTIFY_PROVIDER_URL='api.twilio.com' is not an http",
        ),
        ({"BRAKELINE_SMTP_STARTTLS": "maybe"}, "BRAKELINE_SMTP_STARTTLS='maybe' is not a boolean"),
        ({"BRAKELINE_NOTIFY_MAX_ATTEMPTS": "0"}, "BRAKELINE_NOTIFY_MAX_ATTEMPTS=0 is below 1"),
        ({"BRAKELINE_LOG_LEVEL": "loud"}, "BRAKELINE_LOG_LEVEL='loud' is not one of DEBUG"),
    ],
)
def test_misconfiguration_fails_at_start_saying_what_to_set(tmp_path, env, sentence):
    result = settings_probe(tmp_path, **env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and sentence in result.stderr


OPERATOR_PROBE = (
    "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'config.settings'; django.setup();"
    "from django.conf import settings as s;"
    "print(s.COMMAND_ACK_TIMEOUT_SECONDS['checkpoint_and_pause'],"
    " s.COMMAND_ACK_TIMEOUT_SECONDS['terminate'], s.COMMAND_ACK_TIMEOUT_SECONDS['lower_lr'],"
    " s.EXECUTOR_GRACE_SECONDS, s.HEARTBEAT_TIMEOUT_FLOOR_SECONDS,"
    " s.ESCALATION_DECISION_SECONDS, s.BRAKELINE_PUBLIC_URL, s.NOTIFY_PROVIDER_BASE_URL)"
)


def test_what_an_operator_sets_reaches_the_settings(tmp_path):
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    clean.update(
        BRAKELINE_DATA_DIR=str(tmp_path),
        BRAKELINE_COMMAND_ACK_TIMEOUT_SECONDS="checkpoint_and_pause=900, terminate=45.5",
        BRAKELINE_EXECUTOR_GRACE_SECONDS="30",
        BRAKELINE_HEARTBEAT_FLOOR_SECONDS="20",
        BRAKELINE_ESCALATION_DECISION_SECONDS="600",
        BRAKELINE_PUBLIC_URL="https://brakeline.example.org",
        BRAKELINE_NOTIFY_PROVIDER_URL="https://api.example.com/2010-04-01/Accounts/AC1",
    )
    result = subprocess.run(
        [sys.executable, "-c", OPERATOR_PROBE],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "900.0",
        "45.5",
        "120.0",
        "30.0",
        "20.0",
        "600.0",
        "https://brakeline.example.org",
        "https://api.example.com/2010-04-01/Accounts/AC1",
    ]


def test_every_command_kind_has_an_acknowledgement_deadline():
    from django.conf import settings

    from breakers.models import CommandKind

    assert set(settings.COMMAND_ACK_TIMEOUT_SECONDS) == set(CommandKind.values)


def test_every_variable_the_settings_read_is_in_the_readmes_table():
    import re

    sources = [ROOT / "config" / "settings.py", ROOT / "config" / "notifications.py"]
    read = {name for f in sources for name in re.findall(r'"(BRAKELINE_[A-Z_]+)"', f.read_text())}
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Configuration") :].split("\n## ", 1)[0]
    assert len(read) > 30
    assert sorted(name for name in read if f"`{name}`" not in table) == []
