"""docker-compose.yml describes the production stack, and every command names real code.

There is no Docker engine on these machines, so the file is checked by reading it: the
services that must exist, their health checks, and that each python/daphne/celery command
points at a module or app that imports.
"""

from __future__ import annotations

import importlib
import importlib.util

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
