"""The SDK's version: the one source, read by ``sdk/pyproject.toml`` and by the modules that
report it (the User-Agent, environment snapshots). Imports nothing, so any module can import it."""

__version__ = "0.1.0"
