"""Shared by the rule set tests: a team with a job, a person per role, the default pack."""

from __future__ import annotations

import pytest


@pytest.fixture
def crew(db):
    """``scene`` with the default pack installed (a transactional test may have flushed it)."""
    # Imported here: the pure core's tests run without Django (-p no:django).
    from breakers.detection.rules import install_default_pack
    from tests.support.authz import make_scene

    install_default_pack()
    return make_scene()


def disable(key: str = "loss-deviation") -> list[dict]:
    return [{"op": "disable", "key": key}]
