from django.apps import AppConfig


class IncidentsConfig(AppConfig):
    name = "incidents"
    verbose_name = "Teams, jobs and incidents"
