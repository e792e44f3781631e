"""A clock for the `clock` option: tests move bgq's time forward instead of sleeping."""

from __future__ import annotations

import datetime as dt
import time as _time
from typing import Any


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


class FakeTime:
    """A stand-in for the `time` module of one bgq module whose time.monotonic() and
    time.perf_counter() a test moves forward: `monkeypatch.setattr(bgq.jobs.executor, "time",
    fake)`, then `fake.advance(1.2)` is what a process stopped (SIGSTOP, a paused VM) or busy for
    1.2 s sees, without waiting. Every other name is the real time module's."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return _time.monotonic() + self.offset

    def perf_counter(self) -> float:
        return _time.perf_counter() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(_time, name)


def fake_time(monkeypatch: Any, *modules: Any) -> FakeTime:
    """One FakeTime as the `time` of every module given (bgq.modes.work, bgq.modes.pipeline, ...)."""
    fake = FakeTime()
    for module in modules:
        monkeypatch.setattr(module, "time", fake)
    return fake
