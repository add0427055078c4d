"""The ASGI application as a process that serves it starts it (config.asgi)."""

from __future__ import annotations

import threading

from django.conf import settings


def test_a_process_that_does_not_judge_silence_by_the_beacon_writes_none():
    """The suite's process serves the application (communicator tests) and judges silence on
    the tests' own clocks (tests/conftest.py): a beacon there would write on the real clock
    into their database, and forgive a busy test process's "deafness" by moving the deadlines
    of their jobs. Daphne's processes, which judge by it, keep theirs (test_console_hearing)."""
    import config.asgi  # noqa: F401  (the application, as the tests serve it)

    assert settings.JUDGE_SILENCE_BY_BEACON is False
    assert not [thread for thread in threading.enumerate() if thread.name == "hearing"]
