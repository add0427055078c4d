"""What the sandbox probe costs a snapshot: the SDK's sandbox section and hardware section,
against the package list the snapshot already held, and the whole snapshot.

Run from the repository root:  python bench/sandbox_probe.py [--repeat R]

Everything runs in the snapshot's background thread, never in the training loop; the figure
says how much longer that thread works because of readiness grading. Medians of R runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sdk"))

from brakeline._sandbox import hardware, sandbox_facts  # noqa: E402
from brakeline.snapshot import installed_packages, take_snapshot  # noqa: E402


def median_ms(function, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    repeat = parser.parse_args().repeat
    sandbox = median_ms(lambda: sandbox_facts(os.environ), repeat)
    hw = median_ms(hardware, repeat)
    packages = median_ms(installed_packages, repeat)
    whole = median_ms(take_snapshot, max(3, repeat // 4))
    count = len(installed_packages())
    print(f"sandbox section: median {sandbox:.2f} ms; hardware: {hw:.2f} ms")
    print(f"package list ({count} distributions): median {packages:.1f} ms")
    print(
        f"whole snapshot: median {whole:.1f} ms; sandbox + hardware = "
        f"{(sandbox + hw) / whole:.1%} of it"
    )


if __name__ == "__main__":
    main()
