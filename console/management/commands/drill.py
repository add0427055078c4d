"""``manage.py drill --team T --scenario S|all``: run fire drills now and print the scorecard
(docs/drills.md). ``--drill-set UUID`` carries out a set queued from the API or the UI (the
console starts it so, in a process of its own). Exit status 1 when any line failed.

It first asks the console the sandboxes report to (``--console-url``, else BRAKELINE_PUBLIC_URL)
for its health, and stops at once, in one sentence, when nothing answers there. While the
drills run it prints a line per stage. Ctrl-C or SIGTERM stops it cleanly: the drills become
"error" and their sandboxes are ended before it exits."""

from __future__ import annotations

import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from breakers.drills import runs
from breakers.drills.console_check import console_health
from breakers.drills.runner import run_drill_set
from breakers.models import DrillRun, DrillStatus
from core.errors import ServiceError
from incidents.models import Team


class Command(BaseCommand):
    help = "Run fire drills on sandbox jobs and print their scorecards."

    def add_arguments(self, parser):
        parser.add_argument("--team", help="The team whose rules, policy and people are drilled.")
        parser.add_argument(
            "--scenario",
            action="append",
            default=[],
            help="A scenario (repeat it for several) or 'all' (the full drill set, the default; "
            "'every' is accepted as a synonym).",
        )
        parser.add_argument("--executor", default="local", choices=runs.EXECUTORS)
        parser.add_argument(
            "--workload",
            default="builtin",
            choices=runs.WORKLOADS,
            help="builtin (the built-in PyTorch workload) or team (the team's own command, "
            "where BRAKELINE_DRILL_TEAM_COMMANDS allows it).",
        )
        parser.add_argument(
            "--console-url",
            default=None,
            help="The console as the sandbox reaches it (default BRAKELINE_PUBLIC_URL).",
        )
        parser.add_argument(
            "--corrupt-checkpoint",
            action="store_true",
            help="Damage the checkpoint before the 'loads' line (tests the checker itself).",
        )
        parser.add_argument("--drill-set", default=None, help="Carry out this queued set.")

    def handle(self, *args, **options):
        url = options["console_url"] or str(settings.BRAKELINE_PUBLIC_URL)
        if options["drill_set"]:
            drill_set = options["drill_set"]
            self._check_console(url, drill_set)
        else:
            team = Team.objects.filter(name=options["team"] or "").first()
            if team is None:
                raise CommandError(f"No team {options['team']!r} (--team).")
            self._check_console(url, None)
            scenarios = [s for value in options["scenario"] for s in value.split(",") if s]
            try:
                queued = runs.request_drills(
                    team,
                    scenarios or ["all"],
                    executor=options["executor"],
                    workload=options["workload"],
                    corrupt_checkpoint=options["corrupt_checkpoint"],
                    launch=False,
                )
            except ServiceError as error:
                raise CommandError(error.detail) from None
            drill_set = str(queued[0].drill_set)
        finished = self._run(drill_set, url)
        if not finished:
            raise CommandError(f"Drill set {drill_set} has no queued drill.")
        for run in finished:
            self._print(run)
        if not all(run.passed for run in finished):
            raise CommandError("Not every scorecard line passed.", returncode=1)

    def _check_console(self, url: str, drill_set: str | None) -> None:
        """Nothing starts against a console that does not answer: its sandboxes could never
        report, and the drill would only wait out its deadlines. A queued set's drills then
        end as "error" with the sentence, which their pages show."""
        problem, note = console_health(url)
        if problem is None:
            if note is not None:
                self._progress(self.style.WARNING(note))
            return
        if drill_set is not None:
            for run in DrillRun.objects.filter(drill_set=drill_set, status=DrillStatus.QUEUED):
                runs.fail_with_error(run, problem)
        raise CommandError(problem)

    def _progress(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()  # a log file or a pipe sees each line as it happens

    def _run(self, drill_set: str, url: str) -> list[DrillRun]:
        """The set, stoppable: SIGTERM (a supervisor, `kill`) ends it like Ctrl-C, so the
        runner's clean-up ends every sandbox (a session of its own, which no signal to this
        process reaches) instead of leaving them running."""
        self._progress(f"Drill set {drill_set}: sandboxes report to {url}")
        in_main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGTERM) if in_main_thread else None
        if in_main_thread:
            signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            return run_drill_set(drill_set, console_url=url, progress=self._progress)
        except KeyboardInterrupt:
            raise CommandError(
                f"Stopped before the drill set {drill_set} finished: its drills are marked "
                "error and their sandboxes are ended.",
                returncode=130,
            ) from None
        finally:
            if in_main_thread:
                signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)

    def _print(self, run: DrillRun) -> None:
        self.stdout.write(
            f"\nDrill #{run.pk} {run.scenario} on job {run.job_id} "
            f"({run.executor}): {run.status.upper()}"
        )
        if run.command:
            self.stdout.write(f"  workload: {run.command}")
        if run.error:
            self.stdout.write(f"  error: {run.error}")
        for check in run.checks.all():
            mark = "PASS" if check.passed else "FAIL"
            self.stdout.write(
                f"  {mark}  {check.name:<30} {check.measured}  (expected {check.expectation})"
            )
