"""Start-up of the entry points (manage.py, Daphne through config/asgi.py): settings that do not
parse stop the process with their one sentence naming the variable, and status 2, instead of a
traceback that ends in it. Not on import of the settings themselves: django.setup() in a
library or a shell still raises ImproperlyConfigured."""

from __future__ import annotations

import os
import sys

BAD_SETTINGS_EXIT_STATUS = 2


def settings_or_exit() -> None:
    """Load the settings module now; on a bad variable, say why and exit."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        settings.INSTALLED_APPS  # noqa: B018 (loads the settings module: a bad variable stops here)
    except ImproperlyConfigured as error:
        print(error, file=sys.stderr)
        sys.exit(BAD_SETTINGS_EXIT_STATUS)
