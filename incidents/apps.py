from django.apps import AppConfig
from django.db.models.signals import post_save


class IncidentsConfig(AppConfig):
    name = "incidents"
    verbose_name = "Teams, jobs and incidents"

    def ready(self) -> None:
        # Imported once the apps are loaded (models are usable only then), not at the top.
        from incidents.models import Team

        # Registers the notification tasks in every process that loads the apps: the services
        # queue them by name (incidents.notifications.queue).
        from incidents.notifications import tasks  # noqa: F401
        from incidents.teams.defaults import give_default_policy

        post_save.connect(give_default_policy, sender=Team, dispatch_uid="team-default-policy")
