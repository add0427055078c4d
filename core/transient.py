"""Errors of the console's own infrastructure, not of one job: retried, never blamed on a job.

A lost PostgreSQL connection, a deadlock, Redis or the Celery broker unreachable: the work is
retried (a task's autoretry, the next watchdog tick) and the outage shows on the health
endpoint. None of them is "this job's breakers are failing": caught as that, one Redis restart
would page the on-call for every running job.
"""

from __future__ import annotations

import kombu.exceptions
import redis.exceptions
from django.db import InterfaceError, OperationalError

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    # What Celery raises when it cannot publish a task (the broker, Redis here, is down): an
    # on_commit enqueue after the work committed, the same outage as above.
    kombu.exceptions.OperationalError,
)
