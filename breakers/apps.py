from django.apps import AppConfig


class BreakersConfig(AppConfig):
    name = "breakers"
    verbose_name = "Metrics, rules and the control plane"

    def ready(self) -> None:
        # Registers the control plane's tasks in every process that loads the apps: services
        # below the task module queue some of them by name (breakers.recovery.progress).
        from breakers.control import tasks  # noqa: F401
