"""manage.py create_job --team TEAM --name NAME [--kind training|inference]

Creates the job (and its team if it does not exist) and prints the agent token on the last
line of its output, so scripts can take it with ``| tail -n 1``.
"""

from django.core.management.base import BaseCommand, CommandError

from core.errors import ServiceError
from incidents.jobs import create_job
from incidents.models import JobKind


class Command(BaseCommand):
    help = "Create a training or inference job and print its agent token (shown once)."

    def add_arguments(self, parser):
        parser.add_argument("--team", required=True, help="Team name (created if new).")
        parser.add_argument("--name", required=True, help="Job name, unique within the team.")
        parser.add_argument("--kind", default=JobKind.TRAINING, choices=JobKind.values)

    def handle(self, *args, team: str, name: str, kind: str, **options):
        try:
            created = create_job(team, name, kind)
        except ServiceError as error:
            fields = "; ".join(f"{key} {why}" for key, why in error.fields.items())
            raise CommandError(f"{error.detail}{' (' + fields + ')' if fields else ''}") from None
        job = created.job
        if created.team_created:
            self.stdout.write(f"Created team {job.team.name!r}.")
        self.stdout.write(
            f"Created {job.kind} job {job.name!r} (id {job.pk}) in team {job.team.name!r}."
        )
        self.stdout.write("Its agent token follows; it is shown once and stored only hashed.")
        self.stdout.write(created.raw_token)
