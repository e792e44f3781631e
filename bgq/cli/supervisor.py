"""`bgq work --concurrency N`: N forked worker processes, restarted when they die, stopped together.

Why a loop of our own: the maintained supervisors (supervisord, circus) are daemons one runs bgq
under, not libraries to embed, and the pool libraries (loky, pebble) run tasks, not long-lived
workers. This loop is small, and it holds these rules:

- Stop means stop. SIGTERM or SIGINT is forwarded to every running worker at once, also during
  a restart pause (the pause ends at once), and no worker is started after it. A worker started
  in the instant the signal came is sent SIGTERM as soon as it exists.
- A worker that exits non-zero (a crash, SIGKILL, the OOM killer) is started again after a
  pause; one that exits 0 by itself (a DieException) is not. A worker that dies within
  CRASH_WINDOW seconds of its start "crashed at start": each such crash in a row doubles its
  slot's pause (RESTART_DELAY up to RESTART_DELAY_MAX), and after CRASH_LIMIT of them the
  supervisor stops the others and raises WorkersCrashing (`bgq work` prints one line, exit 1),
  for the outer supervisor (systemd, Kubernetes) to act on. A worker that ran longer resets it.
- A worker whose supervisor is gone (SIGKILL, the OOM killer) stops as on SIGTERM within
  PARENT_CHECK seconds, so a restarted supervisor never runs beside orphans.
- Before any fork the queue is checked in this process (options, the database reached, the
  install's version): a bad configuration or an unreachable database is one error here, not N
  crash loops.

A system supervisor in front (systemd `Restart=on-failure`, supervisord) stays the recommended
deployment; this one only keeps N workers of one host together.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

from ..errors import BgqError
from ..modes.stopping import GracefulStop
from ..modes.work import check, work
from ..queue import Queue

RESTART_DELAY = 0.5  # first pause before a dead worker is started again, in seconds
RESTART_DELAY_MAX = 30.0  # the pause doubles with each crash at start in a row, up to this
CRASH_WINDOW = 5.0  # a worker that dies this soon after its start crashed at start
CRASH_LIMIT = 5  # that many crashes at start in a row of one worker: give up
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
PARENT_CHECK = 1.0  # s between a worker's checks that its supervisor is still alive


class WorkersCrashing(BgqError):
    """The worker processes keep dying right after their start."""


@dataclass
class _Slot:
    """One of the N workers: its running process (or None) and its record of crashes."""

    process: BaseProcess | None = None
    started: float = 0.0
    crashes: int = 0  # crashes at start in a row
    restart_at: float | None = None  # when to start it again (time.monotonic()); None: not due


def run_workers(make_queue: Callable[[], Queue], concurrency: int, **options: Any) -> int:
    """Run `work(make_queue(), **options)` in `concurrency` processes (forked; 1: this process).

    `make_queue` is called here once to check the queue before any worker starts, and once in
    each worker. Returns 0, or 1 if a worker exited non-zero while they were being stopped;
    raises WorkersCrashing when a worker keeps crashing at start (see the module's notes).
    """
    queue = make_queue()
    check(queue, **options)
    # SIGTERM while the database is reached (which can take seconds) is a clean stop too.
    with GracefulStop() as stop:
        _ = queue.procs  # reach the database and check the install before any worker starts
        if concurrency == 1:
            return work(queue, stop=stop, **options)
        if stop.requested:
            return 0
    queue.close()  # no pooled socket is inherited by the workers
    return _Supervisor(make_queue, concurrency, options).run()


class _Supervisor:
    def __init__(self, make_queue: Callable[[], Queue], concurrency: int, options: dict[str, Any]) -> None:
        self.make_queue = make_queue
        self.options = options
        self.slots = [_Slot() for _ in range(concurrency)]
        self.context = multiprocessing.get_context("fork")
        self.pid = os.getpid()
        self.stopping = False
        self.code = 0

    def run(self) -> int:
        wake_read, wake_write = os.pipe()
        for fd in (wake_read, wake_write):
            os.set_blocking(fd, False)
        previous_wakeup = signal.set_wakeup_fd(wake_write)  # a signal ends the wait() at once
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            for slot in self.slots:
                self._start(slot)
            while self._loop_once(wake_read):
                pass
        finally:
            if not all(s.process is None for s in self.slots):  # leaving on an error: stop them
                self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(previous_wakeup)
            os.close(wake_read)
            os.close(wake_write)
        return self.code

    def _loop_once(self, wake_read: int) -> bool:
        """Wait for a worker's exit, a signal or a restart that is due, and act; False when done."""
        running = [s.process for s in self.slots if s.process is not None]
        due = [s.restart_at for s in self.slots if s.restart_at is not None and not self.stopping]
        if not running and not due:
            return False
        timeout = max(0.0, min(due) - time.monotonic()) if due else None
        ready = wait([p.sentinel for p in running] + [wake_read], timeout)
        if wake_read in ready:
            while True:
                try:
                    if not os.read(wake_read, 512):
                        break
                except BlockingIOError:
                    break
        now = time.monotonic()
        for slot in self.slots:
            if slot.process is not None and slot.process.exitcode is not None:
                self._exited(slot, now)
        for slot in self.slots:
            if not self.stopping and slot.restart_at is not None and slot.restart_at <= now:
                self._start(slot)
        return True

    def _exited(self, slot: _Slot, now: float) -> None:
        assert slot.process is not None
        code, slot.process = slot.process.exitcode, None
        if self.stopping:
            if code != 0:
                self.code = 1
            return
        if code == 0:
            return  # it stopped by itself (a DieException): not restarted
        slot.crashes = slot.crashes + 1 if now - slot.started < CRASH_WINDOW else 0
        if slot.crashes >= CRASH_LIMIT:
            self._stop_all()
            raise WorkersCrashing(
                f"a bgq work process died within {CRASH_WINDOW:g} s of its start {CRASH_LIMIT} times "
                f"in a row (last exit code {code}); giving up: see its output above."
            )
        pause = min(RESTART_DELAY * 2 ** max(slot.crashes - 1, 0), RESTART_DELAY_MAX)
        slot.restart_at = now + pause

    def _start(self, slot: _Slot) -> None:
        slot.restart_at = None
        if self.stopping:
            return
        process = self.context.Process(target=_child, args=(self.make_queue, self.options, self.pid))
        process.start()
        slot.process, slot.started = process, time.monotonic()
        if self.stopping:  # the signal came while it was being forked: it stops too
            self._terminate(process)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.pid:  # a worker, between its fork and its own handlers: not started
            os._exit(0)
        self.stopping = True
        for slot in self.slots:
            slot.restart_at = None
            if slot.process is not None:
                self._terminate(slot.process)

    def _terminate(self, process: BaseProcess) -> None:
        """SIGTERM to a worker that has not been reaped (a zombie ignores it; no waitpid here, as
        this runs in the signal handler too)."""
        if process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)

    def _stop_all(self) -> None:
        """Send every running worker SIGTERM and wait for them (they finish their running job)."""
        self.stopping = True
        for slot in self.slots:
            slot.restart_at = None
            if slot.process is not None:
                self._terminate(slot.process)
        for slot in self.slots:
            if slot.process is not None:
                slot.process.join()
                slot.process = None


def _watch_parent(parent: int, stop: GracefulStop) -> None:
    """Stop this worker as SIGTERM would once its supervisor is gone (SIGKILL, the OOM killer):
    an orphan would go on claiming unseen, beside the workers of a restarted supervisor."""
    while not stop.requested:
        if os.getppid() != parent:
            gone = f"its supervisor (pid {parent}) is gone; stopping"
            print(f"bgq: worker {os.getpid()}: {gone}.", file=sys.stderr)
            stop.requested = True
            return
        time.sleep(PARENT_CHECK)


def _child(make_queue: Callable[[], Queue], options: dict[str, Any], parent: int) -> None:
    """A worker process: its own signal handling and connections, then work() until stopped."""
    code = 1
    try:
        with GracefulStop() as stop:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent forwards Ctrl-C as SIGTERM
            signal.set_wakeup_fd(-1)  # the parent's wake-up pipe is not this process's
            queue = make_queue()
            queue.database.engine.dispose(close=False)  # never share the parent's pooled sockets
            watch = threading.Thread(target=_watch_parent, args=(parent, stop), daemon=True)
            watch.start()
            code = work(queue, stop=stop, **options)
    except BgqError as exc:
        print(f"bgq: worker {os.getpid()}: {exc}", file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)
