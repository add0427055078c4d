"""manage.py demo: the whole loop on one machine, for a newcomer's first minute.

Creates a demo team with one user per role, (re)creates the demo training job, starts the
console under Daphne, then runs a real tiny PyTorch training with the brakeline SDK
(``console/demo_training.py``, a subprocess) that diverges on purpose and gets braked, until
Ctrl-C (or --seconds). torch is not a dependency of the console: without it, or with
--simulator, the standard-library simulation (``console.simulator``) plays the job instead.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import time as dt_time
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from breakers.declarations import declare_own_root
from console.simulator import SimulatedRun
from incidents.agent_tokens import revoke_agent_tokens
from incidents.job_size import declare_job_size
from incidents.jobs import create_job, retire_job
from incidents.models import (
    Contact,
    Job,
    Membership,
    NotificationPolicy,
    OnCallRotation,
    Role,
    Team,
)

DEMO_TEAM = "demo"
DEMO_JOB = "demo-run"
DEMO_ACCELERATOR = "H100 80GB (the demo's declared stand-in: it trains on the CPU)"
DEMO_PASSWORD = "brakeline-demo"
RETIRED = "the demo was started again; this run's training process ended with the earlier demo"
STOPPED = "the demo was stopped, and its training process with it"
DEMO_USERS = {
    "admin": Role.ADMIN,
    "manager": Role.MANAGER,
    "oncall": Role.ONCALL,
    "viewer": Role.VIEWER,
}


TRAINING_SCRIPT = Path(__file__).resolve().parents[2] / "demo_training.py"


def set_up_demo_data() -> tuple[str, str]:
    """Demo users and a new demo job; returns the job's name and its agent token.

    Earlier demo jobs stay, with their incidents (a second run shows two incidents and a team
    report with two rows): they are only retired, so nothing from an earlier run can still
    report, be watched for heartbeats or be aimed at by an executor (its PID may be reused).
    Their runs are over (the earlier demo stopped their processes), so they are terminated
    and their alerts resolved: the dashboard shows no paused run with an L3 firing for ever.
    """
    User = get_user_model()
    with transaction.atomic():
        team, _ = Team.objects.get_or_create(name=DEMO_TEAM)
        for username, role in DEMO_USERS.items():
            user, _ = User.objects.get_or_create(username=username)
            user.set_password(DEMO_PASSWORD)
            user.is_staff = user.is_superuser = role == Role.ADMIN
            user.save()
            Membership.objects.update_or_create(user=user, team=team, defaults={"role": role})
        earlier = Job.objects.filter(team=team, name__startswith=DEMO_JOB)
        for job in earlier:
            revoke_agent_tokens(job)
            retire_job(job.pk, RETIRED)
        earlier.update(heartbeat_deadline=None, agent_pid=None)
        set_up_demo_paging(team)
        name = demo_job_name(set(earlier.values_list("name", flat=True)))
        created = create_job(DEMO_TEAM, name)
        # The demo's runs write their checkpoints under var/checkpoints: the console chose that
        # folder, so it declares it as the job's checkpoint root (the catalogue takes only what
        # lies under a declared root).
        checkpoints = settings.DATA_DIR / "checkpoints"
        checkpoints.mkdir(parents=True, exist_ok=True)
        declare_own_root(created.job, str(checkpoints))
        # The tiny CPU run stands for one node of eight accelerators, and says so: declared,
        # the review measures the accelerator-hours a late brake would have burnt.
        declare_job_size(created.job.pk, nodes=1, gpus_per_node=8, accelerator=DEMO_ACCELERATOR)
    return name, created.raw_token


def retire_demo_run(job_name: str) -> None:
    job = Job.objects.filter(team__name=DEMO_TEAM, name=job_name).first()
    if job is not None:
        retire_job(job.pk, STOPPED)


# Where the demo's people are reached. Nothing is sent there: the demo turns the Outbox on
# (BRAKELINE_NOTIFY_OUTBOX), and the console's Outbox page shows what would have gone out.
DEMO_PHONES = {"oncall": "+15550100001", "manager": "+15550100002", "admin": "+15550100003"}
DEMO_CHAT_WEBHOOK = "https://chat.demo.invalid/brakeline"


def set_up_demo_paging(team: Team) -> None:
    """A policy, phones and e-mail addresses, and a weekly rotation (oncall, then manager)
    handing over at 09:00 UTC: the demo's pages reach someone, and a drill's "paged" line
    passes, without a provider."""
    User = get_user_model()
    for username, phone in DEMO_PHONES.items():
        user = User.objects.get(username=username)
        User.objects.filter(pk=user.pk).update(email=f"{username}@demo.invalid")
        Contact.objects.update_or_create(user=user, defaults={"phone": phone})
    NotificationPolicy.objects.update_or_create(
        team=team, defaults={"chat_webhook_url": DEMO_CHAT_WEBHOOK}
    )
    people = [User.objects.get(username=name).pk for name in ("oncall", "manager")]
    OnCallRotation.objects.update_or_create(
        team=team,
        name="demo",
        defaults={
            "people": people,
            "length_days": 7,
            "handoff_time": dt_time(9, 0),
            "time_zone": "UTC",
            "starts_on": timezone.now().date() - timedelta(days=1),
        },
    )


def demo_job_name(taken: set[str]) -> str:
    """``demo-run`` the first time, then ``demo-run-2``, ``demo-run-3``…"""
    if DEMO_JOB not in taken:
        return DEMO_JOB
    number = 2
    while f"{DEMO_JOB}-{number}" in taken:
        number += 1
    return f"{DEMO_JOB}-{number}"


def stop_process(process: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM, then SIGKILL if it is still there after ``grace`` seconds (a loaded machine can
    make a clean shutdown slow; the demo must never leave a console running behind it)."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_for_port(host: str, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise CommandError(f"The console did not start listening on {host}:{port}.")


def torch_installed() -> bool:
    """Without importing it: torch takes seconds and hundreds of MB to import."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken or blocked installation counts as missing
        return False


def refuse_a_busy_port(host: str, port: int) -> None:
    """A console already listening there (an earlier demo) would take this demo's traffic."""
    with socket.socket() as probe:
        if probe.connect_ex((host, port)) == 0:
            raise CommandError(f"Something already listens on {host}:{port}; use --port.")


def stop_like_ctrl_c() -> None:
    """Stopped from outside (kill, a supervisor's SIGTERM, the terminal closed: SIGHUP), the
    demo ends like Ctrl-C, so the console and the training run (a session of its own, which
    the terminal's hang-up never reaches) are stopped too instead of being left running. And
    Ctrl-C works even when started from a shell that ignores SIGINT (a job started with `&`):
    Python keeps an inherited "ignore", and the demo could then never be stopped."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, signal.default_int_handler)


def start_console(host: str, port: int) -> subprocess.Popen:
    """Daphne serving the console; it keeps the demo's pages in its Outbox."""
    os.environ.setdefault("BRAKELINE_NOTIFY_OUTBOX", "true")
    # No access log (a line per agent request): console.request_log sums them up.
    daphne = ["-m", "daphne", "-b", host, "-p", str(port), "--verbosity", "0"]
    return subprocess.Popen([sys.executable, *daphne, "config.asgi:application"])


class Command(BaseCommand):
    help = "Start the console with demo users and a training run that diverges and gets braked."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--steps", type=int, default=None, help="Stop after N steps.")
        parser.add_argument(
            "--seconds", type=float, default=None, help="Stop everything after S seconds."
        )
        parser.add_argument(
            "--diverge-at", type=int, default=None, help="Step where the divergence starts."
        )
        parser.add_argument(
            "--simulator",
            action="store_true",
            help="Use the simulated run (standard library only) instead of real PyTorch.",
        )

    def handle(self, *args, host: str, port: int, simulator: bool, **options):
        call_command("migrate", verbosity=0)
        job_name, token = set_up_demo_data()
        if not simulator and not torch_installed():
            self.stdout.write(
                self.style.WARNING(
                    "install torch for the real training run; falling back to the simulator "
                    "(pip install torch==2.13.0, see docs/testing.md)"
                )
            )
            simulator = True
        refuse_a_busy_port(host, port)
        stop_like_ctrl_c()
        server = start_console(host, port)
        # --seconds ends the demo the way Ctrl-C does, whatever the run is doing (even paused).
        # A real SIGINT, not _thread.interrupt_main: that one cannot interrupt a blocking wait.
        timer = threading.Timer(options["seconds"] or 0, os.kill, (os.getpid(), signal.SIGINT))
        try:
            wait_for_port(host, port)
            self.print_welcome(host, port, simulator, job_name)
            if options["seconds"] is not None:
                timer.start()
            url = f"http://{host}:{port}"
            if simulator:
                self.simulate(url, token, options)
            else:
                self.train(url, token, job_name, options)
        except KeyboardInterrupt:
            self.stdout.write("\nStopping the demo.")
        finally:
            timer.cancel()
            # Its process is gone: the run is over, not silent. Left "running", the next console
            # on this var/ would raise a heartbeat alert for it, and page for it.
            retire_demo_run(job_name)
            stop_process(server)

    def simulate(self, url: str, token: str, options: dict) -> None:
        checkpoints = settings.DATA_DIR / "checkpoints"
        checkpoints.mkdir(parents=True, exist_ok=True)
        run = SimulatedRun(url=url, token=token, checkpoint_dir=checkpoints)
        if options["diverge_at"] is not None:
            run.diverge_at_step = options["diverge_at"]
            run.nan_at_step = options["diverge_at"] + 200
        run.run(max_steps=options["steps"])

    def train(self, url: str, token: str, job_name: str, options: dict) -> None:
        """The real training run, in its own process: it must not share this one's Django.
        Its token goes through the environment only (BRAKELINE_TOKEN), never on its command
        line, which every user of the machine reads (`ps`, /proc/PID/cmdline)."""
        data = Path(settings.DATA_DIR)
        command = [
            sys.executable,
            "-P",
            str(TRAINING_SCRIPT),
            "--url",
            url,
            "--job",
            job_name,
            "--checkpoint-dir",
            str(data / "checkpoints" / job_name),
            "--spill-dir",
            str(data / "spill"),
            "--diverge-at",
            str(options["diverge_at"] or 500),
        ]
        if options["steps"] is not None:
            command += ["--steps", str(options["steps"])]
        # -P keeps console/ off sys.path (its celery.py would shadow Celery); the SDK's source
        # (sdk/) goes on it instead, for brakeline when it is not installed.
        path = [str(settings.BASE_DIR / "sdk"), os.environ.get("PYTHONPATH", "")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)))
        env.setdefault("OMP_NUM_THREADS", "1")  # a tiny model; leave the cores to the console
        # The token in its environment and a session of its own: what the console's local
        # executor checks before it signals a hung process (never one of its own group).
        env["BRAKELINE_TOKEN"] = token
        training = subprocess.Popen(command, env=env, start_new_session=True)
        try:
            training.wait()
        finally:
            stop_process(training, grace=30)  # it finishes its run (final heartbeat), exits

    def print_welcome(self, host: str, port: int, simulator: bool, job_name: str) -> None:
        mode = "embedded (SQLite, in-process worker)" if settings.EMBEDDED else "server"
        self.stdout.write(
            self.style.SUCCESS(f"\nBrakeline is running at http://{host}:{port}/ — {mode}")
        )
        self.stdout.write(f"Log in as any of these (password {DEMO_PASSWORD!r}):")
        for username, role in DEMO_USERS.items():
            self.stdout.write(f"  {username:<8} {role.label}")
        what = (
            "A simulated training run"
            if simulator
            else "A real PyTorch training run (CPU, brakeline SDK)"
        )
        when = "a minute" if simulator else "half a minute"
        self.stdout.write(
            f"Its pages (SMS, phone, chat, e-mail) are kept in the console's Outbox: "
            f"http://{host}:{port}/outbox/ — log in as oncall to answer them."
        )
        self.stdout.write(
            f"{what} ({DEMO_TEAM}/{job_name}) streams metrics now; it diverges on purpose "
            f"after about {when} and the console brakes it. Ctrl-C stops everything.\n"
        )
