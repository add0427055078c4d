from django.apps import AppConfig


class BreakersConfig(AppConfig):
    name = "breakers"
    verbose_name = "Metrics, rules and the control plane"
