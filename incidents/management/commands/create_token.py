"""manage.py create_token --user USERNAME [--name NAME]

Creates a personal API token for an existing user and prints it on the last line of its output
(shown once, stored hashed), so scripts can take it with ``| tail -n 1``.
"""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from core.errors import ServiceError
from incidents.teams.audit import AuditContext
from incidents.teams.tokens import issue_personal_token


class Command(BaseCommand):
    help = "Create a personal API token for a user and print it (shown once)."

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="Username of an existing user.")
        parser.add_argument("--name", default="script", help="What the token is for.")

    def handle(self, *args, user: str, name: str, **options):
        person = get_user_model().objects.filter(username=user).first()
        if person is None:
            raise CommandError(f"There is no user {user!r}.")
        try:
            issued = issue_personal_token(person, name, context=AuditContext(via="command"))
        except ServiceError as error:
            raise CommandError(error.detail) from None
        self.stdout.write(f"Created token {issued.token.prefix}… ({name!r}) for {user!r}.")
        self.stdout.write("It follows; it is shown once and stored only hashed.")
        self.stdout.write(issued.raw)
