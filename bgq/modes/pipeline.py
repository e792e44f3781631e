"""The result pipeline of `bgq work` and `bgq consume`: held jobs, writer thread, give-backs, backpressure.

Both modes run one job at a time on their main thread and hand its result to a second thread, the
writer, which writes whatever has accumulated while the main thread runs the next job (group
commit). `Pipeline` owns everything between the claim and the write, the same in both modes:

- the claimed jobs waiting their turn (`hold`, `next`): the job held longest runs first;
- staleness: a claimed job not started within `hold_seconds` is given back (a READY result, its
  attempts restored) by whichever thread looks first, so a slow job never holds others hostage
  and the reaper never finds a claimed-but-unstarted job;
- the writer thread: it waits for results (or a stale job, or the close), takes all of them and
  passes them to the mode's `write` function in one call. An exception out of `write` is logged
  at CRITICAL and the writer goes on with the next batch: what was written stays written, an
  unwritten job stays PROCESSING for the reaper;
- backpressure (`caught_up`): the mode claims or takes nothing more while `batch_max` results
  wait unwritten;
- flushing (`flush`): wait until every result handed over is written, and count the writes, so
  `bgq work` knows whether a claim that found nothing may have raced with a write;
- closing (`close`): the held jobs are given back, every result is written, the writer ends.

Only the write itself is the mode's own: bgq/modes/work.py writes with `{table}_finish_batch` (and hands
a group's job off on its main thread), bgq/modes/consume.py with `{table}_finish_batch` and
`{table}_finish` and publishes what the results call for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from ..jobs.executor import Executor
from ..model import Claimed, FinishResult, JobResult, JobState, Outcome
from .parts import Parts

#: Jobs one claim (`bgq work --batch`) or one take of messages (`bgq consume` prefetch) holds at most.
BATCH_MAX = 100
#: Seconds of work one claim or take should hold.
BATCH_BUDGET = 0.05


class BatchSize:
    """How many jobs the next claim (bgq work) or take of messages (bgq consume) asks for: about
    BATCH_BUDGET seconds of work by a moving average of the jobs' durations, 1 to `most`. The
    first estimate, `first` seconds a job, is "slow" by default, so the first batch is one job
    and the batches grow as jobs prove fast."""

    def __init__(self, most: int = BATCH_MAX, first: float = BATCH_BUDGET) -> None:
        self.most = most
        self.seconds_per_job = first

    def __call__(self) -> int:
        return max(1, min(self.most, int(BATCH_BUDGET / max(self.seconds_per_job, 1e-6))))

    def ran(self, seconds: float) -> None:
        """One job took `seconds`."""
        self.seconds_per_job = 0.8 * self.seconds_per_job + 0.2 * seconds


HOLD_SECONDS = 1.0  # a claimed job not started within this is given back (at most stalled_job_timeout / 2)


@dataclass
class Held:
    """A claimed job waiting its turn on the main thread."""

    job: Claimed
    claimed_at: float  # time.monotonic() taken before the claim's transaction began
    held_since: float  # time.monotonic() once the claim had returned: the hold counts from here


@dataclass
class Done:
    """A job's result to write."""

    job: Claimed
    outcome: Outcome | None  # None: given back unstarted
    clone_delay_ms: int | None = None  # RECURRING, WaitingException: the copy's delay
    keep: bool = False  # `bgq work`: claim the job's group's next head with the result (a hand-off)


Log = logging.Logger | logging.LoggerAdapter[logging.Logger]


class Pipeline:
    """Held claimed jobs and their results on the way to `write`, which the writer thread calls
    with every result that accumulated since its last call (given-back jobs among them)."""

    def __init__(
        self, write: Callable[[list[Done]], object], *, log: Log,
        pinned: Callable[[], AbstractContextManager[None]], batch_max: int, hold_seconds: float,
        wait: float, name: str,
    ) -> None:  # fmt: skip
        """`pinned`: the writer thread's connection for its whole life; `batch_max`: results that
        may wait unwritten before `caught_up` holds the main thread back; `wait`: how long one
        `caught_up` waits at most; `name`: the writer thread's."""
        self.write = write
        self.log = log
        self.pinned = pinned
        self.batch_max = batch_max
        self.hold_seconds = hold_seconds
        self.wait = wait
        self.held: deque[Held] = deque()
        self.done: list[Done] = []
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.writing: list[Done] = []  # results the writer has taken and not yet written
        self.writes = 0  # calls of `write` that have ended (written or not)
        self.failures = 0  # calls of `write` that failed (cron mode's exit status counts them)
        self.closing = False
        self.writer = threading.Thread(target=self._writer, name=name, daemon=True)

    @classmethod
    def for_queue(
        cls, queue: Parts, write: Callable[[list[Done]], object], *, batch_max: int, wait: float, name: str
    ) -> Pipeline:
        """The pipeline of a worker of `queue`: its logger, its database's pinned connection for
        the writer, and a hold of HOLD_SECONDS, at most half of stalled_job_timeout (the reaper
        must never find a claimed-but-unstarted job)."""
        timeout = queue.config.stalled_job_timeout
        return cls(
            write,
            log=queue.config.logger,
            pinned=queue.store.database.pinned,
            batch_max=batch_max,
            hold_seconds=min(HOLD_SECONDS, timeout / 2) if timeout else HOLD_SECONDS,
            wait=wait,
            name=name,
        )

    # --- main thread ---

    def start(self) -> None:
        self.writer.start()

    def close(self) -> None:
        """Give back the held jobs, let the writer write everything and wait for it to end."""
        with self.lock:
            self.closing = True
            for done in self.done:  # no group's next head is claimed any more
                done.keep = False
            self.done.extend(Done(h.job, None) for h in self.held)
            self.held.clear()
            self.wake.notify_all()
        if self.writer.is_alive():
            self.writer.join()

    def hold(self, jobs: Iterable[Claimed], claimed_at: float, held_since: float | None = None) -> None:
        """Queue claimed jobs behind those claimed before them (a group's successor too: the jobs
        held longest run first, so none waits past the hold behind a group's chain). The hold
        counts from `held_since`, by default now: a slow claim must not make its own jobs stale
        on arrival."""
        with self.lock:
            if self.closing:  # a hand-off that ended after close(): give its jobs back at once
                self.done.extend(Done(job, None) for job in jobs)
                self.wake.notify_all()
                return
            since = time.monotonic() if held_since is None else held_since
            self.held.extend(Held(job, claimed_at, since) for job in jobs)

    def holding(self) -> int:
        """How many claimed jobs wait their turn."""
        with self.lock:
            return len(self.held)

    def next(self) -> Held | None:
        """The next claimed job to run; one that waited longer than the hold is given back instead."""
        with self.lock:
            self._release_stale()
            if self.done:
                self.wake.notify_all()
            return self.held.popleft() if self.held else None

    def put(self, done: Done) -> None:
        """Hand a result to the writer."""
        with self.lock:
            self.done.append(done)
            self.wake.notify_all()

    def take(self) -> list[Done]:
        """The results handed over that the writer has not taken yet, for the caller to write
        itself (it then writes them before anything it hands over later)."""
        with self.lock:
            batch, self.done = self.done, []
            return batch

    def writer_idle(self) -> bool:
        """Whether the writer is between writes (nothing taken and not yet written)."""
        with self.lock:
            return not self.writing

    def ahead(self) -> tuple[int, int]:
        """(Claimed jobs waiting their turn, results handed over that claim their group's next
        head: jobs held once they are written), read together: a hand-off that ends meanwhile
        moves a job from the second count to the first, never out of both."""
        with self.lock:
            return len(self.held), sum(d.keep for d in (*self.done, *self.writing))

    def groups(self) -> set[str]:
        """The serial groups of the jobs held and of the results that claim their group's next
        head: the groups a `bgq work` worker keeps."""
        with self.lock:
            held = {g for h in self.held if (g := h.job.claim.serial_group) is not None}
            pending = {g for d in (*self.done, *self.writing) if d.keep and (g := d.job.claim.serial_group)}
            return held | pending

    def flush(self, wait: float) -> int:
        """Wait up to `wait` seconds for every result handed over so far to be written; return
        how many writes the writer has ended since it started (a caller that saw no change
        since an earlier call knows nothing was written in between)."""
        with self.lock:
            if self.done or self.writing:  # `put` woke the writer for them already
                self.wake.wait_for(lambda: not self.done and not self.writing or self.closing, timeout=wait)
            return self.writes

    def caught_up(self) -> bool:
        """Backpressure: True once fewer than `batch_max` results wait to be written (taken by the
        writer or not); the caller claims or takes nothing more until then. Without it a writer
        slower than the callbacks (fast jobs, a slow commit) fell behind without bound: tens of
        thousands of jobs run but not recorded, all to run again if the process died. False after
        `wait` seconds of waiting, so the caller looks at its stop flag."""
        with self.lock:
            return self.wake.wait_for(
                lambda: len(self.done) + len(self.writing) < self.batch_max or self.closing,
                timeout=self.wait,
            )

    # --- writer thread ---

    def _writer(self) -> None:
        with self.pinned():
            while True:
                with self.lock:
                    self.wake.wait_for(
                        lambda: self.done or self.closing or self._stale(), timeout=self.hold_seconds / 4
                    )
                    self._release_stale()
                    batch, self.done = self.done, []
                    self.writing = batch
                    closing = self.closing
                if batch:
                    try:
                        self.write(batch)
                    except Exception as exc:  # the writer must outlive any one batch
                        # Reached only past Executor.persist's own retries (e.g. an error that is
                        # not the database's, or a broker send): what was written stays written;
                        # an unwritten job stays PROCESSING for the reaper.
                        self.log.critical("bgq: Writing results failed; going on.", exc_info=exc)
                        with self.lock:
                            self.failures += 1
                    finally:
                        with self.lock:
                            self.writing = []
                            self.writes += 1
                            self.wake.notify_all()
                elif closing:
                    return

    def _stale(self) -> bool:
        return bool(self.held) and time.monotonic() - self.held[0].held_since > self.hold_seconds

    def _release_stale(self) -> None:
        """Give back claimed jobs that waited too long to start (the lock is held)."""
        now = time.monotonic()
        keep: deque[Held] = deque()
        for held in self.held:
            if now - held.held_since > self.hold_seconds:
                self.done.append(Done(held.job, None))
            else:
                keep.append(held)
        self.held = keep


def result(done: Done) -> JobResult:
    """`done` as {table}_finish_results takes it (state READY: given back unstarted)."""
    job, outcome = done.job, done.outcome
    if outcome is None:
        return JobResult(job.id, job.claim.attempt or 0, int(JobState.READY))
    return JobResult(
        job.id,
        job.claim.attempt or 0,
        int(outcome.state),
        outcome.error,
        outcome.postponed_by,
        outcome.execution_time,
        outcome.memory,
        done.clone_delay_ms,
    )


def batch_answer(written: dict[int, bool], job_id: int) -> FinishResult:
    """{table}_finish_batch's answer for one job, as {table}_finish would give it: written or not
    (fenced out, or absent), with nothing promoted or copied to publish."""
    return FinishResult(written.get(job_id, False), None, None, None)


def failure(batch: list[Done]) -> str:
    """The message Executor.persist logs when writing `batch` fails."""
    if len(batch) == 1:
        return f"bgq: Writing the result failed; retrying. (ID: {batch[0].job.id})"
    return f"bgq: Writing {len(batch)} results failed; retrying."


def follow_up(executor: Executor, log: Log, done: Done, written: FinishResult) -> None:
    """Log and publish what a written result calls for (Executor.after_finish). A failure is
    logged, so one job's follow-up never costs the other jobs of its batch theirs."""
    if done.outcome is None:
        return
    try:
        executor.after_finish(done.job.id, done.job.claim, done.outcome, written, done.clone_delay_ms)
    except Exception as exc:
        log.critical(f"bgq: Following up a written result failed. (ID: {done.job.id})", exc_info=exc)
