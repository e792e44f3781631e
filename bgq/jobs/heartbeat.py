"""Keeps a running job's claim alive for the reaper (throttled, fenced), and stops a cancelled or lost one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import event

from ..errors import JobAborted

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ..config import Config
    from ..sql.database import Store

_EVENT = "before_cursor_execute"


class Heartbeat:
    """One queue's heartbeat state: the job it is running, when it last beat, and a guard.

    bgq runs one job at a time per Queue, so the current job is a plain attribute. `beat()` may
    still be reached from other threads (an application thread using an engine with the hook
    installed); the non-blocking lock makes a concurrent or re-entrant beat a no-op instead of a
    second write.
    """

    def __init__(self, config: Config, store: Store) -> None:
        self.config = config
        self.store = store
        self.job: tuple[int, int] | None = None  # (job id, claim token) while a callback runs
        self.last = 0.0  # time.monotonic() of the claim or of the last write
        self.lost = False  # the claim was found taken over: warned once, no more writes
        self.aborted: str | None = None  # the cancel's reason once a heartbeat reported it
        self.thread: int | None = None  # the thread running the callback: JobAborted is raised there only
        self.guard = threading.Lock()

    def start(self, job_id: int, attempt: int, claimed_at: float | None = None) -> None:
        """The job starts: its claim's updated_at counts as the first heartbeat (`claimed_at`, a
        time.monotonic() taken before the claim, when the job was claimed ahead in a batch)."""
        self.last = time.monotonic() if claimed_at is None else claimed_at
        self.lost = False
        self.aborted = None
        self.thread = threading.get_ident()
        self.job = (job_id, attempt)

    def stop(self) -> None:
        """The callback has returned (or raised): heartbeats are no-ops until the next claim."""
        self.job = None

    def beat(self) -> None:
        """Write a heartbeat for the current job if one is due. Raises JobAborted, in the thread
        that runs the callback only, once the job was found cancelled or taken over (and on
        every call after that); any other failure is logged, never raised."""
        job = self.job
        if job is None:
            return
        self._raise_if_stopped(job[0])
        interval = self.config.heartbeat_interval
        if interval and time.monotonic() - self.last < interval:
            return
        if not self.guard.acquire(blocking=False):
            return  # a heartbeat is already being written (re-entrancy through a hooked engine)
        job_id, attempt = job
        try:
            self.last = time.monotonic()  # a failed write is throttled like a good one
            with self.store.database.transaction() as conn:
                answer = self.store.procs.beat(conn, job_id, attempt)
            if self.job == job and not answer.alive:
                self.lost = True
                self.config.logger.warning(
                    f"bgq: Heartbeat found the job no longer PROCESSING under this worker's claim "
                    f"(reaped, taken over or finished elsewhere); its result will be dropped. (ID: {job_id})"
                )
            elif self.job == job and answer.abort_requested:
                self.aborted = answer.reason or "Cancelled"
                self.config.logger.info(f"bgq: The job was cancelled while it ran; aborting. (ID: {job_id})")
        except Exception as exc:
            self.config.logger.warning(f"bgq: Heartbeat failed (ID: {job_id}).", exc_info=exc)
        finally:
            self.guard.release()
        self._raise_if_stopped(job_id)

    def _raise_if_stopped(self, job_id: int) -> None:
        if threading.get_ident() != self.thread:
            return
        if self.aborted is not None:
            raise JobAborted(f"{self.aborted} (ID: {job_id})")
        if self.lost:
            raise JobAborted(f"The job was taken over by another worker (reaped). (ID: {job_id})")

    def install(self, engine: Engine | Any) -> Callable[[], None]:
        """Make every statement run on `engine` call `beat()` first; returns the hook's remover.

        Installing twice on one engine registers one hook.
        """
        target = getattr(engine, "sync_engine", engine)  # an AsyncEngine's events live on its sync engine
        if not event.contains(target, _EVENT, self._on_statement):
            event.listen(target, _EVENT, self._on_statement)

        def remove() -> None:
            if event.contains(target, _EVENT, self._on_statement):
                event.remove(target, _EVENT, self._on_statement)

        return remove

    def _on_statement(self, *_args: Any, **_kwargs: Any) -> None:
        self.beat()
