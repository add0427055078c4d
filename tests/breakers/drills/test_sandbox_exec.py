"""The sandbox's parent dies of the signal its command died of, whichever it was: SIGKILL too
(the executor's last resort, the "hang" drill's stop), whose handler cannot be set."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from breakers.drills import sandbox_exec


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_the_parent_dies_of_its_commands_signal(signum):
    suicide = f"import os, signal; os.kill(os.getpid(), {int(signum)})"
    finished = subprocess.run(
        [sys.executable, "-I", sandbox_exec.__file__, "--", sys.executable, "-c", suicide],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == -signum
    assert "Traceback" not in finished.stderr
