"""Started in every Python process of the suite by .ci/suite-clock-ahead (through PYTHONPATH):
its wall clock — time.time(), datetime.now() — runs BRAKELINE_CLOCK_AHEAD_DAYS ahead, ticking.
The monotonic clock stays real, so sleeps and timeouts behave."""

import os

_days = os.environ.get("BRAKELINE_CLOCK_AHEAD_DAYS")
if _days:
    import datetime
    import time

    import time_machine

    _ahead = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=float(_days))
    time_machine.travel(_ahead, tick=True).start()
    # The ticking starts from the first reading of the clock, not from start(): read it now,
    # or a process that first looks at the clock later runs behind the others by that much.
    time.time()
