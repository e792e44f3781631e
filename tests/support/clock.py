"""A clock for the `clock` option: tests move bgq's time forward instead of sleeping."""

from __future__ import annotations

import datetime as dt


class Clock:
    """A settable clock: `Queue(clock=clock)` reads it as bgq's time (every p_now, created_at).

    It starts at the real current time (to the microsecond, so both dialects' rounding shows)
    and stands still until a test moves it with `advance`, so a rule about time ("due after its
    backoff", "reaped after stalled_job_timeout") is tested at its exact edge, without sleeping.
    """

    def __init__(self, start: dt.datetime | None = None) -> None:
        self.now = (start or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> dt.datetime:
        """Move the clock `seconds` forward and return the new time."""
        self.now += dt.timedelta(seconds=seconds)
        return self.now
