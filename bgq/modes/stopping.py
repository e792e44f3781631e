"""GracefulStop: SIGTERM / SIGINT set a flag that every worker loop checks between jobs."""

from __future__ import annotations

import signal
from types import FrameType


class GracefulStop:
    """SIGTERM / SIGINT set a flag: the running callback finishes and its result is written first."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> GracefulStop:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
