"""What the suite's modules share: helpers to import, and fixtures to name.

The modules with fixtures are pytest plugins (``pytest_plugins`` in tests/conftest.py): a test
names ``scene``, ``receiver``, ``team``, ``flow`` or ``worker`` as a parameter and imports
nothing for it. Helpers (``Api``, ``raise_alert``, ``wait_for`` …) are imported by name.
Every module here imports without Django set up (pure tests run with ``-p no:django``): Django
models are imported where they are used.
"""
