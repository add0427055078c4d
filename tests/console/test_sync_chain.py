"""Under ASGI, Django runs the console's middleware in sync mode (console/sync_chain.py).

Django's own middleware, in async mode, calls each ``process_request`` and ``process_response``
through ``sync_to_async``: two switches between the event loop and the request's thread per
middleware. The chain is built the way Daphne's handler builds it (``AsyncClient`` loads the
middleware with ``is_async=True``, as ``ASGIHandler`` does); a spy on ``MiddlewareMixin`` sees
which mode each middleware ran in.
"""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import AsyncClient, override_settings
from django.utils.deprecation import MiddlewareMixin

pytestmark = pytest.mark.django_db


@pytest.fixture
def modes(monkeypatch) -> list[str]:
    """The mode of every Django middleware call during the test: "sync" or "async"."""
    seen: list[str] = []
    sync_call, async_call = MiddlewareMixin.__call__, MiddlewareMixin.__acall__

    def spy_sync(self, request):
        seen.append("sync")
        return sync_call(self, request)

    async def spy_async(self, request):
        seen.append("async")
        return await async_call(self, request)

    monkeypatch.setattr(MiddlewareMixin, "__call__", spy_sync)
    monkeypatch.setattr(MiddlewareMixin, "__acall__", spy_async)
    return seen


def _get(path: str) -> int:
    async def get() -> int:
        return (await AsyncClient().get(path)).status_code

    return async_to_sync(get)()


def test_the_middleware_chain_runs_in_sync_mode_under_asgi(modes) -> None:
    assert _get("/login/") == 200
    # Security, Session, Common, Csrf, Authentication, Message, XFrameOptions: all in sync mode.
    assert modes.count("sync") >= 7
    assert "async" not in modes


def test_without_the_sync_only_middleware_the_chain_would_switch_modes(modes) -> None:
    """The control: the spy does see async mode, which the sync-only middleware prevents."""
    middleware = [m for m in settings.MIDDLEWARE if m != "console.sync_chain.sync_request_chain"]
    with override_settings(MIDDLEWARE=middleware):
        assert _get("/login/") == 200
    assert "async" in modes
