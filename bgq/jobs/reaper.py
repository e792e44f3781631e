"""The stalled-job reaper: one component that `bgq process`, `bgq work` and `bgq consume` all run.

A PROCESSING job whose `updated_at` (claim or last heartbeat) is older than the queue's
`stalled_job_timeout` belonged to a worker that died (or froze): `{table}_reap` turns it into
TEMPORARILY_FAILED with a backoff, and in broker mode its id is sent again; a job whose
attempt had been cancelled (`queue.cancel` of a running job) becomes REDUNDANT instead, and a
WAITING job of its group is promoted. The procedure skips rows another transaction holds (FOR
UPDATE SKIP LOCKED), so a pass never waits; a skipped job is reaped by a later pass. Cron mode
calls `run_once()` in each `process()` run; continuous workers `start()` a thread that calls it
every REAP_INTERVAL seconds (jittered, so many workers do not reap in step), so stall recovery
takes at most stalled_job_timeout + 1.5 * REAP_INTERVAL with any mix of workers, cron or none.
Each pass also reaps the jobs of dead workers (bgq/modes/registry.py: their {table}_worker row has not
been heartbeated for worker_dead_after seconds), so a killed worker's job comes back within
worker_dead_after + 1.5 * REAP_INTERVAL.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import metrics
from ..config import Config
from ..errors import BgqError
from ..model import JobState
from ..sql import retry
from ..sql.database import Store
from .sender import Sender

if TYPE_CHECKING:
    from ..model import Reaped

REAP_LIMIT = 1000  # jobs one pass reaps at most
REAP_INTERVAL = 2.0  # seconds between two passes of a continuous worker's reaper (x 0.5 .. 1.5)


class Reaper:
    """Reaps one queue's stalled jobs: `run_once()` now, or every `interval` s on a thread."""

    def __init__(
        self, config: Config, store: Store, sender: Sender, interval: float = REAP_INTERVAL,
        limit: int = REAP_LIMIT,
    ) -> None:  # fmt: skip
        if interval <= 0 or limit < 1:
            raise ValueError("Reaper: interval must be positive and limit at least 1.")
        self.config = config
        self.store = store
        self.sender = sender
        self.interval = interval
        self.limit = limit
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self, now: dt.datetime | None = None) -> list[Reaped]:
        """Reap the queue's stalled jobs (and its sub-queues'), then the jobs of dead workers
        ({table}_worker_reap: their worker's heartbeat is older than worker_dead_after); the jobs
        reaped. `now`: the clock (None: the server's). Each pass is off when its option is 0."""
        cfg, procs = self.config, self.store.procs
        backoff = cfg.stalled_job_backoff
        backoff_ms = None if backoff is None else backoff * 1000
        passes = (  # (bound in s, the procedure, what the log says of each job it reaped)
            (cfg.stalled_job_timeout, procs.reap, "Stalled job reaped"),
            (cfg.worker_dead_after, procs.worker_reap, "Dead worker's job reaped"),
        )
        reaped: list[Reaped] = []
        for bound, reap, message in passes:
            if not bound:
                continue
            jobs = self._reap(reap, bound, now, backoff_ms)
            for job in jobs:
                if job.state == JobState.REDUNDANT:
                    note = "it had been cancelled, so it stays cancelled"
                    cfg.logger.warning(f"bgq: {message}; {note}. (ID: {job.id}, PID {job.pid})")
                else:
                    cfg.logger.critical(f"bgq: {message}. (ID: {job.id}, PID {job.pid})")
                    self.sender.send_job(job.id)
            reaped.extend(jobs)
        if any(job.state == JobState.REDUNDANT for job in reaped):
            # A cancelled job leaves its group without a hand-off (the procedures do not take the
            # group row after the job rows): promote a WAITING successor (broker mode) now.
            promoted = retry.in_transaction(
                self.store.database, lambda conn: self.store.procs.promote_waiting(conn, now)
            )
            for job_ref in promoted:
                self.sender.send_job(job_ref.id)
        metrics.record_reaped(cfg.queue, len(reaped))
        return reaped

    def _reap(
        self, reap: Callable[..., list[Reaped]], bound: int, now: dt.datetime | None, backoff_ms: int | None
    ) -> list[Reaped]:
        """One pass of `reap` in a transaction of its own, run again on a deadlock (on Galera also
        a lost certification: another node's claim or result wrote the same row)."""
        queue, limit = self.config.queue, self.limit
        return retry.in_transaction(
            self.store.database, lambda conn: reap(conn, queue, bound, limit, now, backoff_ms=backoff_ms)
        )

    def start(self) -> None:
        """Reap on a daemon thread of its own until stop(); a failed pass is logged and retried
        at the next one. A no-op when stalled_job_timeout and worker_dead_after are 0 or the
        thread runs already."""
        cfg = self.config
        if not (cfg.stalled_job_timeout or cfg.worker_dead_after) or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="bgq-reaper", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread (a pass under way ends first)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout)

    def _loop(self) -> None:
        # The first pass comes at a random point of the first interval: workers started together
        # spread out.
        pause = random.uniform(0, self.interval)
        while not self._stop.wait(pause):
            try:
                self.run_once()
            except BgqError as exc:  # the database is down: the next pass tries again
                self.config.logger.warning(f"bgq: Reaping stalled jobs failed. ({exc})")
            except Exception as exc:  # never let the thread die silently
                self.config.logger.error("bgq: Reaping stalled jobs failed.", exc_info=exc)
            pause = self.interval * random.uniform(0.5, 1.5)
