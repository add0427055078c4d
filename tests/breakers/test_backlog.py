"""The in-flight count of a web process's agent requests (breakers.control.backlog): pure,
on a clock the test moves."""

from __future__ import annotations

import pytest

from breakers.control.backlog import InFlight
from breakers.control.hearing import BACKLOG_AFTER_SECONDS, BACKLOG_AT_MOST_SECONDS, backlog_lag


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_oldest_request_held_is_the_backlog() -> None:
    clock = Clock()
    in_flight = InFlight(clock)
    assert in_flight.oldest_age() == 0.0
    first = in_flight.enter()
    clock.now += 3
    second = in_flight.enter()
    clock.now += 1
    assert (len(in_flight), in_flight.oldest_age()) == (2, 4.0)
    assert in_flight.leave(first) == 4.0
    assert in_flight.oldest_age() == 1.0
    in_flight.leave(second)
    assert (len(in_flight), in_flight.oldest_age()) == (0, 0.0)
    assert in_flight.leave(second) == 0.0  # let go twice: nothing


def test_the_time_the_client_takes_to_send_its_body_is_not_the_consoles() -> None:
    clock = Clock()
    in_flight = InFlight(clock)
    held = in_flight.hold()
    clock.now += 0.5  # the token looked up
    held.pause()
    clock.now += 30  # a client that sends slowly
    assert in_flight.oldest_age() == 0.0
    held.resume()
    clock.now += 0.25
    assert in_flight.oldest_age() == 0.75
    held.release()
    held.release()
    assert len(in_flight) == 0


@pytest.mark.parametrize(
    "oldest, lag",
    [
        (0.0, 0.0),
        (0.2, 0.0),  # served in its time
        (BACKLOG_AFTER_SECONDS, 0.0),
        (BACKLOG_AFTER_SECONDS + 0.5, BACKLOG_AFTER_SECONDS + 0.5),
        (40.0, 40.0),
        (BACKLOG_AT_MOST_SECONDS + 500.0, BACKLOG_AT_MOST_SECONDS),  # a request stuck for good
    ],
)
def test_a_lag_counts_once_it_is_a_backlog(oldest: float, lag: float) -> None:
    assert backlog_lag(oldest) == lag
