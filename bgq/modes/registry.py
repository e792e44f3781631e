"""The worker registry: each worker process's row in {table}_worker, registered, heartbeated, removed.

`bgq work`, `bgq consume` and `bgq process` each register one row at their start (host, pid,
mode, queue, version) and a daemon thread heartbeats it every `worker_heartbeat_interval`
seconds with the job the process runs and how many it has run (read from the Executor). A clean
exit removes the row. A process that dies without that (SIGKILL, the OOM killer, a lost host)
stops heartbeating: once its row is older than `worker_dead_after`, the Reaper's
`{table}_worker_reap` takes back its PROCESSING jobs (those whose worker_id names it) and deletes
the row, so its group moves on within seconds instead of `stalled_job_timeout`.

The worker's id lives in `Executor.worker_id` while it is registered: the claims store it in the
jobs they claim (the `p_worker_id` of the claim procedures). A heartbeat that finds its row gone
(reaped while this process was frozen) registers a new row, so the process is listed again; its
old jobs were reaped, and their late results are fenced out as usual.
"""

from __future__ import annotations

import os
import socket
import threading
from importlib import metadata
from types import TracebackType

from ..model import WorkerMode
from .parts import Parts


def version() -> str:
    """The installed bgq's version (a source tree without metadata: '0+unknown')."""
    try:
        return metadata.version("bgq")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class Registry:
    """One worker process's registration: `start()` registers it and starts the heartbeat thread,
    `stop()` stops the thread and removes the row. Used as a context manager by the worker loops;
    a no-op when the queue's executor is registered already (cron's pass inside `bgq process`)."""

    def __init__(self, parts: Parts, mode: WorkerMode, queue: str) -> None:
        self.config = parts.config
        self.store = parts.store
        self.executor = parts.executor
        self.mode = WorkerMode(mode)
        self.queue = queue
        self.host = socket.gethostname()[:255]
        self.id: int | None = None
        self._owner = False  # this registry registered the executor (not an outer one)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Registry:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> int | None:
        """Register (unless the executor is registered already) and start heartbeating; the id.
        A failed registration is logged and retried by the heartbeat thread: the process runs
        jobs meanwhile, reaped by stalled_job_timeout alone if it dies."""
        if self.executor.worker_id is not None:
            return self.executor.worker_id
        self._owner = True
        try:
            self._register()
        except Exception as exc:
            self.config.logger.warning(f"bgq: Registering the worker failed; retrying. ({exc})")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="bgq-worker-heartbeat", daemon=True)
        self._thread.start()
        return self.id

    def stop(self, timeout: float = 10.0) -> None:
        """Stop heartbeating and remove the row (a clean exit). Never raises."""
        if not self._owner:
            return
        self._owner = False
        thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None:
            thread.join(timeout)
        worker_id, self.id = self.id, None
        self.executor.worker_id = None
        if worker_id is None:
            return
        try:
            with self.store.database.transaction() as conn:
                self.store.procs.worker_deregister(conn, worker_id)
        except Exception as exc:  # the row stays; the dead-worker reaper removes it later
            self.config.logger.warning(f"bgq: Removing the worker's row failed. ({exc})")

    def beat(self) -> bool:
        """One heartbeat (the thread calls it every worker_heartbeat_interval s); False when the row
        was gone and the worker registered again."""
        if self.id is None:
            self._register()
            return False
        executor = self.executor
        with self.store.database.transaction() as conn:
            alive = self.store.procs.worker_heartbeat(
                conn, self.id, executor.current_job_id, executor.jobs_done
            )
        if not alive:
            self.config.logger.warning(
                f"bgq: This worker's row was removed (found dead: was the process frozen?); "
                f"registering again. (worker {self.id})"
            )
            self._register()
        return alive

    def _register(self) -> None:
        with self.store.database.transaction() as conn:
            self.id = self.store.procs.worker_register(
                conn, self.host, os.getpid(), self.mode.value, self.queue, version()
            )
        self.executor.worker_id = self.id

    def _loop(self) -> None:
        interval = self.config.worker_heartbeat_interval
        while not self._stop.wait(interval):
            try:
                self.beat()
            except Exception as exc:  # the database is down: the next beat tries again
                self.config.logger.warning(f"bgq: Worker heartbeat failed. ({exc})")
