from django.apps import AppConfig
from django.db.models.signals import post_save


class IncidentsConfig(AppConfig):
    name = "incidents"
    verbose_name = "Teams, jobs and incidents"

    def ready(self) -> None:
        from incidents.models import Team
        from incidents.teams.defaults import give_default_policy

        post_save.connect(give_default_policy, sender=Team, dispatch_uid="team-default-policy")
