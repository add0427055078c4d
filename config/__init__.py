"""The project package: settings, URLs, ASGI, the Celery app and its one schedule table."""

from config.celery import app as celery_app

__all__ = ["celery_app"]
