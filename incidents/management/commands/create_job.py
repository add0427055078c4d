"""manage.py create_job --team TEAM --name NAME [--kind training|inference]
[--nodes N --gpus-per-node G [--accelerator NAME]]

Creates the job (and its team if it does not exist) and prints the agent token on the last
line of its output, so scripts can take it with ``| tail -n 1``. With ``--nodes`` and
``--gpus-per-node`` it declares what the job occupies (a review's accelerator-hours).
"""

from django.core.management.base import BaseCommand, CommandError

from core.errors import ServiceError
from incidents.job_size import declare_job_size, parse_job_size
from incidents.jobs import create_job
from incidents.models import JobKind


class Command(BaseCommand):
    help = "Create a training or inference job and print its agent token (shown once)."

    def add_arguments(self, parser):
        parser.add_argument("--team", required=True, help="Team name (created if new).")
        parser.add_argument("--name", required=True, help="Job name, unique within the team.")
        parser.add_argument("--kind", default=JobKind.TRAINING, choices=JobKind.values)
        parser.add_argument("--nodes", type=int, help="Nodes the job runs on (its size).")
        parser.add_argument("--gpus-per-node", type=int, help="Accelerators per node.")
        parser.add_argument("--accelerator", default="", help='e.g. "H100 80GB".')

    def handle(self, *args, team: str, name: str, kind: str, **options):
        try:
            size = _size(options)
            created = create_job(team, name, kind)
            if size is not None:
                declare_job_size(
                    created.job.pk, nodes=size[0], gpus_per_node=size[1], accelerator=size[2]
                )
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


def _size(options: dict) -> tuple[int, int, str] | None:
    """The declared size, checked before the job is created; None when not given."""
    nodes, per_node = options.get("nodes"), options.get("gpus_per_node")
    if nodes is None and per_node is None:
        return None
    return parse_job_size(
        {"nodes": nodes, "gpus_per_node": per_node, "accelerator": options.get("accelerator", "")}
    )
