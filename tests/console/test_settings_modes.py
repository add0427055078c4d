"""The env-driven settings: embedded by default, server with both URLs, loud when half-set."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PROBE = (
    "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'console.settings'; django.setup();"
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
        BRAKELINE_SECRET_KEY="k" * 50,
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
    ],
)
def test_misconfiguration_fails_at_start_saying_what_to_set(tmp_path, env, sentence):
    result = settings_probe(tmp_path, **env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and sentence in result.stderr
