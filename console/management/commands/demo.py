"""manage.py demo: the whole loop on one machine, for a newcomer's first minute.

Creates a demo team with one user per role, (re)creates a simulated training job, starts the
console under Daphne and streams the simulated run into it until Ctrl-C.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from console.simulator import SimulatedRun
from incidents.models import Job, Membership, Role, Team
from incidents.services import create_job

DEMO_TEAM = "demo"
DEMO_JOB = "demo-run"
DEMO_PASSWORD = "brakeline-demo"
DEMO_USERS = {
    "admin": Role.ADMIN,
    "manager": Role.MANAGER,
    "oncall": Role.ONCALL,
    "viewer": Role.VIEWER,
}


def set_up_demo_data() -> str:
    """Demo users and a fresh demo job; returns the job's agent token."""
    User = get_user_model()
    with transaction.atomic():
        team, _ = Team.objects.get_or_create(name=DEMO_TEAM)
        for username, role in DEMO_USERS.items():
            user, _ = User.objects.get_or_create(username=username)
            user.set_password(DEMO_PASSWORD)
            user.is_staff = user.is_superuser = role == Role.ADMIN
            user.save()
            Membership.objects.update_or_create(user=user, team=team, defaults={"role": role})
        Job.objects.filter(team=team, name=DEMO_JOB).delete()
    return create_job(DEMO_TEAM, DEMO_JOB).raw_token


def wait_for_port(host: str, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise CommandError(f"The console did not start listening on {host}:{port}.")


class Command(BaseCommand):
    help = "Start the console with demo users and a simulated training run that gets braked."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--steps", type=int, default=None, help="Stop after N steps.")

    def handle(self, *args, host: str, port: int, steps: int | None, **options):
        call_command("migrate", verbosity=0)
        token = set_up_demo_data()
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                host,
                "-p",
                str(port),
                "console.asgi:application",
            ]
        )
        try:
            wait_for_port(host, port)
            self.print_welcome(host, port)
            checkpoints = settings.DATA_DIR / "checkpoints"
            checkpoints.mkdir(parents=True, exist_ok=True)
            SimulatedRun(url=f"http://{host}:{port}", token=token, checkpoint_dir=checkpoints).run(
                max_steps=steps
            )
        except KeyboardInterrupt:
            self.stdout.write("\nStopping the demo.")
        finally:
            server.terminate()
            server.wait(timeout=10)

    def print_welcome(self, host: str, port: int) -> None:
        mode = "embedded (SQLite, in-process worker)" if settings.EMBEDDED else "server"
        self.stdout.write(
            self.style.SUCCESS(f"\nBrakeline is running at http://{host}:{port}/ — {mode}")
        )
        self.stdout.write(f"Log in as any of these (password {DEMO_PASSWORD!r}):")
        for username, role in DEMO_USERS.items():
            self.stdout.write(f"  {username:<8} {role.label}")
        self.stdout.write(
            f"A simulated training run ({DEMO_TEAM}/{DEMO_JOB}) streams metrics now; "
            "it diverges on purpose after a minute. Ctrl-C stops everything.\n"
        )
