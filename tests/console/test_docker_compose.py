"""docker-compose.yml describes the production stack, and every command names real code.

There is no Docker engine on these machines, so the file is checked by reading it: the
services that must exist, their health checks, and that each python/daphne/celery command
points at a module or app that imports.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_the_stack_has_its_services(compose):
    assert {"postgres", "redis", "web", "worker", "beat"} <= set(compose["services"])


@pytest.mark.parametrize("name", ["postgres", "redis", "web", "worker"])
def test_long_running_services_have_health_checks(compose, name):
    assert compose["services"][name]["healthcheck"]["test"]


def test_the_database_has_a_volume(compose):
    volumes = compose["services"]["postgres"]["volumes"]
    assert any(v.endswith(":/var/lib/postgresql/data") for v in volumes)
    assert set(compose["volumes"]) >= {volumes[0].split(":")[0]}


def test_app_services_get_both_urls(compose):
    for name in ("web", "worker", "beat"):
        env = compose["services"][name]["environment"]
        assert env["DATABASE_URL"].startswith("postgresql://") and env["REDIS_URL"].startswith(
            "redis://"
        )


def _module_of(command: list[str]) -> tuple[str, str | None]:
    """(module, attribute) that a service command runs."""
    if command[:3] == ["python", "-m", "daphne"]:
        module, _, attribute = command[-1].partition(":")
        return module, attribute
    if command[0] == "celery":
        return command[command.index("-A") + 1], "celery_app"
    if command[:2] == ["python", "manage.py"]:
        return "django.core.management", None
    raise AssertionError(f"unknown command form: {command}")


@pytest.mark.parametrize("name", ["web", "worker", "beat", "migrate"])
def test_every_command_names_a_real_module(compose, name):
    command = compose["services"][name]["command"]
    module_name, attribute = _module_of(command)
    module = importlib.import_module(module_name)
    if attribute:
        assert getattr(module, attribute) is not None
    if command[:2] == ["python", "manage.py"]:
        assert (ROOT / "manage.py").exists()
        assert command[2] in {"migrate"}


def test_the_worker_consumes_the_queue_tasks_are_sent_to(compose):
    from django.conf import settings

    command = compose["services"]["worker"]["command"]
    # The test run overrides the queue name (BRAKELINE_CELERY_QUEUE); production uses the default.
    assert "BRAKELINE_CELERY_QUEUE" not in compose["services"]["worker"]["environment"]
    queues = command[command.index("--queues") + 1].split(",")
    default = settings.DEFAULT_CELERY_QUEUE
    assert queues == [f"{default}-watchdog", default, f"{default}-ticks"]


def test_the_image_copies_every_package_the_console_distribution_ships():
    """The Dockerfile lists what it copies; a package added to the project must be in it."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    copied = {
        line.split()[1]
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ")
    }
    assert set(packages) | {"sdk", "templates"} <= copied


def test_the_balancer_is_the_one_published_port_in_front_of_the_web_replicas(compose):
    services = compose["services"]
    balancer = services["balancer"]
    assert balancer["image"].startswith("haproxy:")
    assert balancer["ports"] == ["8000:8000"] and "ports" not in services["web"]
    (mount,) = balancer["volumes"]
    source, target = mount.split(":")[:2]
    assert (ROOT / source).resolve() == ROOT / "deploy" / "haproxy.cfg"
    assert target == "/usr/local/etc/haproxy/haproxy.cfg"
    config = (ROOT / "deploy" / "haproxy.cfg").read_text()
    # Replicas are found through Docker's DNS under the service's name, on Daphne's port.
    web_port = services["web"]["command"][services["web"]["command"].index("-p") + 1]
    assert f" web:{web_port} " in config and "resolvers docker" in config
    assert services["balancer"]["healthcheck"]["test"]


def _replicas(service: dict) -> int:
    value = str(service.get("deploy", {}).get("replicas", 1))
    # "${BRAKELINE_WEB_REPLICAS:-2}": the default compose uses when the variable is unset.
    return int(value.rsplit(":-", 1)[-1].rstrip("}"))


def test_web_worker_and_beat_run_replicas(compose):
    services = compose["services"]
    assert _replicas(services["web"]) >= 2 and _replicas(services["worker"]) >= 2
    # Two beats: one sends while it holds the lease (config/beat.py), the other waits for it.
    assert _replicas(services["beat"]) >= 2


@pytest.mark.parametrize("name", ["postgres", "redis", "balancer", "web", "worker", "beat"])
def test_every_long_running_service_restarts_when_it_dies(compose, name):
    assert compose["services"][name]["restart"] in {"unless-stopped", "always"}


def test_the_one_off_migration_is_not_restarted(compose):
    assert compose["services"]["migrate"]["restart"] == "no"


def test_the_balancer_configuration_is_valid_haproxy():
    import shutil
    import subprocess

    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(haproxy).exists():
        pytest.skip("HAProxy is not installed here (.ci/run installs it)")
    checked = subprocess.run(
        [haproxy, "-c", "-f", str(ROOT / "deploy" / "haproxy.cfg")],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
