"""Reading the operator's environment variables: each value parsed, or start-up stopped with
a sentence naming the variable (config/startup.py prints it alone)."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean: set it to true or false.")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number.") from None


def seconds(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number of seconds above 0.")
    return value


def env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    return seconds(name, raw) if raw else default


def env_seconds_by_kind(name: str, defaults: dict[str, float]) -> dict[str, float]:
    """``kind=seconds`` pairs, comma-separated, over ``defaults`` (whose keys are the kinds)."""
    values = dict(defaults)
    for pair in filter(None, (p.strip() for p in os.environ.get(name, "").split(","))):
        kind, equals, raw = (part.strip() for part in pair.partition("="))
        if not equals or kind not in defaults:
            raise ImproperlyConfigured(
                f"{name}: {pair!r} is not kind=seconds with kind one of {', '.join(defaults)} "
                "(e.g. checkpoint_and_pause=600,terminate=180)."
            )
        values[kind] = seconds(f"{name} ({kind})", raw)
    return values


def env_url(name: str, default: str) -> str:
    raw = os.environ.get(name, default).strip()
    if raw and not raw.startswith(("http://", "https://")):
        raise ImproperlyConfigured(f"{name}={raw!r} is not an http:// or https:// URL.")
    return raw


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name, "").strip() or default
    if raw.upper() not in choices:
        raise ImproperlyConfigured(f"{name}={raw!r} is not one of {', '.join(choices)}.")
    return raw.upper()


def env_host_ports(name: str, default_port: int) -> list[tuple[str, int]]:
    """``a:1,b:2`` → ``[("a", 1), ("b", 2)]`` (a bare host takes ``default_port``)."""
    pairs = []
    for item in filter(None, (part.strip() for part in os.environ.get(name, "").split(","))):
        host, _, port = item.rpartition(":") if ":" in item else (item, "", str(default_port))
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ImproperlyConfigured(f"{name}: {item!r} is not host:port (e.g. db1:5432).")
        pairs.append((host, int(port)))
    return pairs
