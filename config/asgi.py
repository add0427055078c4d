"""ASGI entry point: HTTP through Django, websockets through Channels (Daphne serves both)."""

import os

from django.core.asgi import get_asgi_application

from config.startup import settings_or_exit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
settings_or_exit()  # a variable that does not parse: Daphne stops with its one sentence
django_asgi_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from console.agent_lean import agent_http_stack  # noqa: E402
from console.routing import websocket_urlpatterns  # noqa: E402

if settings.EMBEDDED:
    # No beat process in the embedded mode: the periodic tasks tick in this process instead.
    from config.schedule import start_embedded_ticker

    start_embedded_ticker()

# The web tier's beacon: the watchdog counts no silence while it is missing. Where silence is
# not judged by it (the test suite's process, whose watchdog runs on clocks the tests move), a
# beacon would only write on the real clock into the tests' database, and forgive "deafness"
# whenever that process was busy: none there.
if settings.JUDGE_SILENCE_BY_BEACON:
    from breakers.control.hearing import start_beacon

    start_beacon()

application = ProtocolTypeRouter(
    {
        # Agent requests are authenticated before their body is read, and bounded; the hot
        # path's are then answered without Django's middleware and DRF.
        "http": agent_http_stack(django_asgi_application),
        # Django's path() patterns, as channels documents; its stubs want their own subclass.
        "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),  # type: ignore[arg-type]
    }
)
