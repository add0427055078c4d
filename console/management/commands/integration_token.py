"""``manage.py integration_token <team> [--name alertmanager]``: a team's token for its
Alertmanager webhook (docs/monitoring.md). Printed once; stored hashed."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from breakers.models import IntegrationToken
from incidents.models import Team


class Command(BaseCommand):
    help = "Issue an integration token (Alertmanager's webhook) for a team."

    def add_arguments(self, parser):
        parser.add_argument("team", help="The team's name.")
        parser.add_argument("--name", default="alertmanager", help="What the token is for.")

    def handle(self, *args, team: str, name: str, **options):
        found = Team.objects.filter(name=team).first()
        if found is None:
            raise CommandError(f"No team {team!r}.")
        _, raw = IntegrationToken.issue(found, name[:100])
        self.stdout.write(raw)
