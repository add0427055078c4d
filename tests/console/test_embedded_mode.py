"""The embedded mode (SQLite, in-process worker) stays alive: migrate, create a job, ingest.

Run in subprocesses with no DATABASE_URL / REDIS_URL, exactly as `make demo` runs it, so the
default a newcomer meets cannot rot while the rest of the suite runs on PostgreSQL.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from bench._stack import daphne_command
from tests.conftest import ROOT, free_port, wait_for_port

pytestmark = pytest.mark.embedded


@pytest.fixture
def embedded_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env.pop("BRAKELINE_SECRET_KEY", None)
    env["BRAKELINE_DATA_DIR"] = str(tmp_path)
    return env


def manage(env, *args: str) -> str:
    return python(env, "manage.py", *args)


def python(env, *args: str) -> str:
    """What a Python process of the embedded mode printed (it must succeed)."""
    result = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def post(url: str, token: str, body: dict) -> dict:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def wait_for_healthy(url: str, timeout: float = 60.0) -> dict:
    """The in-process watchdog ticks every second, so health turns ok shortly after start."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_embedded_console_takes_metrics_including_nan_on_sqlite(embedded_env, tmp_path):
    manage(embedded_env, "migrate", "--verbosity", "0")
    token = manage(embedded_env, "create_job", "--team", "demo", "--name", "toy").splitlines()[-1]
    port = free_port()
    server = subprocess.Popen(
        daphne_command(port),
        cwd=ROOT,
        env=embedded_env,
    )
    try:
        wait_for_port(port, server)
        base = f"http://127.0.0.1:{port}"
        answer = post(
            f"{base}/api/v1/agent/metrics",
            token,
            {
                "points": [
                    {"name": "loss", "step": 1, "value": 2.0},
                    {"name": "loss", "step": 2, "value": "NaN"},
                    {"name": "loss", "step": 3, "value": "-Infinity"},
                ]
            },
        )
        # Evaluation runs in-process, so the brake for the NaN rides on this very reply.
        assert answer["accepted"] == 3
        assert [c["kind"] for c in answer["commands"]] == ["checkpoint_and_pause"]
        heartbeat = post(f"{base}/api/v1/agent/heartbeat", token, {"step": 3, "status": "running"})
        assert heartbeat["commands"] == answer["commands"]  # until acknowledged
        assert wait_for_healthy(f"{base}/api/v1/health")["mode"] == "embedded"
    finally:
        server.terminate()
        server.wait(timeout=10)
    with sqlite3.connect(tmp_path / "brakeline.sqlite3") as database:
        rows = database.execute(
            "SELECT step, value FROM breakers_metricpoint ORDER BY step"
        ).fetchall()
        status = database.execute("SELECT status FROM incidents_job").fetchone()[0]
    assert rows[0] == (1, 2.0)
    assert rows[1] == (2, "NaN")  # kept as data, not turned into NULL
    assert rows[2] == (3, float("-inf"))
    assert status == "pausing"  # braked, waiting for the checkpoint's confirmation


def test_embedded_orm_reads_nan_back_as_a_float(embedded_env):
    manage(embedded_env, "migrate", "--verbosity", "0")
    script = (
        "import math, django, os; os.environ['DJANGO_SETTINGS_MODULE']='config.settings';"
        "django.setup();"
        "from incidents.jobs import create_job; from breakers.models import MetricPoint;"
        "from django.utils import timezone; job = create_job('t', 'j').job;"
        "MetricPoint.objects.create(job=job, name='loss', step=1, time=timezone.now(), "
        "value=float('nan'));"
        "print(math.isnan(MetricPoint.objects.get().value))"
    )
    printed = python(embedded_env, "-c", script)
    assert printed.strip() == "True"


def test_the_recovery_evidence_reads_a_nodes_hardware_alerts_on_sqlite(embedded_env):
    """The evidence of a verdict (breakers.recovery.evidence) asks for the node's hardware
    alerts; a JSON containment lookup there made every brake's acknowledgement a 500 in the
    embedded mode, which SQLite cannot answer."""
    manage(embedded_env, "migrate", "--verbosity", "0")
    script = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE']='config.settings';"
        "django.setup();"
        "from django.utils import timezone;"
        "from breakers.recovery.evidence import hardware_signals;"
        "from incidents.jobs import create_job; from incidents.models import Alert;"
        "job = create_job('t', 'j').job; now = timezone.now();"
        "common = dict(job=job, severity='L4', layer='health', rule_name='XID', metric='x',"
        " description='d', value=1.0, first_step=1, first_time=now, step=1, raised_at=now,"
        " last_seen_at=now, status='firing', action='none', runbook_key='k',"
        " runbook_suggestion='s');"
        "Alert.objects.create(rule_key='hardware-error', fingerprint='a', node='',"
        " nodes=['gpu-a'], **common);"
        "Alert.objects.create(rule_key='hardware-error', fingerprint='b', node='gpu-b', **common);"
        "print(hardware_signals(job.pk, 'gpu-a'))"
    )
    printed = python(embedded_env, "-c", script)
    assert printed.strip() == "['hardware-error on gpu-a (L4, firing)']"


def test_a_nodes_acknowledgements_are_counted_together_on_sqlite(embedded_env):
    """The ranks' answers inserted in one statement (a retry ignored) and counted by status
    and step in SQL (breakers.control.acks): SQLite answers both."""
    manage(embedded_env, "migrate", "--verbosity", "0")
    script = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE']='config.settings';"
        "django.setup();"
        "from breakers.control.acknowledge import Answer, acknowledge_command_ranks;"
        "from breakers.control.commands import issue_command;"
        "from incidents.jobs import create_job; from incidents.models import Job;"
        "job = create_job('t', 'j').job; Job.objects.filter(pk=job.pk).update(world_size=3);"
        "issue = lambda: issue_command(job.pk, 'lower_lr', reason='r', params={'factor': 0.5});"
        "one, two = issue().command, issue().command;"
        "a = lambda r, s=7: Answer('succeeded', {'rank': r, 'step': s}, '', r);"
        "say = lambda c, answers: print([getattr(o, 'status', o) for o in"
        " acknowledge_command_ranks(job.pk, c.pk, answers)]);"
        "say(one, [a(0), a(1), a(0), a(5)]); say(one, [a(1), a(2)]);"
        "say(two, [a(0), a(1, 8)])"
    )
    printed = python(embedded_env, "-c", script)
    assert printed.split("\n")[:3] == [
        "['pending', 'pending', 'pending', 400]",
        "['succeeded', 'succeeded']",
        "['failed', 'failed']",
    ]
