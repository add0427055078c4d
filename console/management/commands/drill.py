"""``manage.py drill --team T --scenario S|all``: run fire drills now and print the scorecard
(docs/drills.md). ``--drill-set UUID`` carries out a set queued from the API or the UI (the
console starts it so, in a process of its own). Exit status 1 when any line failed."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from breakers.drills import runs
from breakers.drills.runner import run_drill_set
from breakers.models import DrillRun
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
            "--workload", default="builtin", choices=runs.WORKLOADS,
            help="builtin (the built-in PyTorch workload) or team (the team's own command, "
            "where BRAKELINE_DRILL_TEAM_COMMANDS allows it).",
        )  # fmt: skip
        parser.add_argument(
            "--console-url", default=None, help="The console as the sandbox reaches it "
            "(default BRAKELINE_PUBLIC_URL).",
        )  # fmt: skip
        parser.add_argument(
            "--corrupt-checkpoint",
            action="store_true",
            help="Damage the checkpoint before the 'loads' line (tests the checker itself).",
        )
        parser.add_argument("--drill-set", default=None, help="Carry out this queued set.")

    def handle(self, *args, **options):
        if options["drill_set"]:
            drill_set = options["drill_set"]
        else:
            team = Team.objects.filter(name=options["team"] or "").first()
            if team is None:
                raise CommandError(f"No team {options['team']!r} (--team).")
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
        finished = run_drill_set(drill_set, console_url=options["console_url"])
        if not finished:
            raise CommandError(f"Drill set {drill_set} has no queued drill.")
        for run in finished:
            self._print(run)
        if not all(run.passed for run in finished):
            raise CommandError("Not every scorecard line passed.", returncode=1)

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
