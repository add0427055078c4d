"""Started in every Python process of the suite by .ci/suite-clock-ahead (through PYTHONPATH):
its wall clock — time.time(), datetime.now() — runs BRAKELINE_CLOCK_AHEAD_DAYS ahead, ticking.
The monotonic clock stays real, so sleeps and timeouts behave."""

import os

_days = os.environ.get("BRAKELINE_CLOCK_AHEAD_DAYS")
if _days:
    import datetime

    import time_machine

    _ahead = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=float(_days))
    time_machine.travel(_ahead, tick=True).start()
