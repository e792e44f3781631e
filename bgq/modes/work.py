"""`bgq work`: a long-running worker on the database alone: batch claims, group hand-off, batched results.

One worker process runs one job at a time on its main thread and keeps a second thread, the
writer, for bookkeeping (bgq/modes/pipeline.py, shared with `bgq consume`: held jobs, the writer thread,
give-backs, backpressure):

- Claims: `{table}_claim_batch` claims up to `size` due jobs in one transaction (ungrouped jobs
  and heads of up to HEADS_MAX idle groups, in (priority, id) order). `size` adapts to how long
  jobs take, so that one claim holds about BATCH_BUDGET seconds of work (1 for slow jobs, up to
  `batch_max` for fast ones).
- Every result reaches the table through `_write`, one call of `{table}_hand_off`, which writes
  the results (fencing, the RECURRING / WaitingException copy, the group's wake-up, as
  `{table}_finish_results` does) and, in the same transaction, claims the next head of each group
  whose result is *kept*: the worker keeps the groups it claimed, so a group's next job is claimed
  by the commit that records the previous one, and never waits for a claim:
  - a result goes to the writer thread, which writes whatever has accumulated in one call while
    the main thread runs the next job (group commit): a result waits for one commit, never for a
    batch to fill or for a slow job to end. Work spread over many groups runs this way: the
    heads the writer claims join the held jobs, so one commit writes several groups' results
    and claims their next heads;
  - when the main thread has nothing else to run and the writer is idle, it writes the result
    itself (a lone group's chain: its successor waits for nothing but that commit);
  - a group is kept while the worker has room for its next job (`size`, below) and for at most
    CHAIN_SECONDS in a row; then its result is written without a hand-off and a full claim
    follows, so better-priority work elsewhere gets its turn. A worker keeps GROUPS_MAX groups
    at most, and claims more only once it keeps half as many (fewer, larger claims).
- A claimed job that has not started within pipeline.HOLD_SECONDS (and half of stalled_job_timeout) is
  given back (state READY, attempts restored) by the writer, so a slow job never holds others
  hostage and the reaper never finds a claimed-but-unstarted job.
- Backpressure: no claim while `batch_max` results wait to be written. An exception out of one
  write on the writer thread is logged at CRITICAL and the writer goes on (the batch's jobs stay
  PROCESSING for the reaper); one job's failing follow-up costs no other job its own.
- Idle: PostgreSQL waits on LISTEN (the insert trigger and released jobs NOTIFY; behind a
  transaction pooler on the queue's `listen_url`, and without one it polls). MySQL has no
  NOTIFY: its waker reads the table's newest id every few milliseconds (procs.Prober) and ends
  the wait when it moved. Either way claims start POLL_MIN seconds apart and double up to `poll`
  while they find nothing (jobs due by time, and candidates another worker took first, send no
  wake-up).
- Stalled jobs (a killed worker's) are reaped by the queue's Reaper on a thread of its own, every
  few seconds (bgq/jobs/reaper.py): no cron run is needed for that.
- SIGTERM / SIGINT: the running job finishes and its result is written, unstarted claimed jobs
  are given back, the results are flushed, then the process exits 0.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence

from sqlalchemy.engine import Connection

from ..errors import BgqError, ConfigError
from ..model import Claimed, WorkerMode
from ..sql.calls import Waker
from .parts import Parts
from .pipeline import BATCH_MAX, BatchSize, Done, Held, Pipeline, batch_answer, failure, follow_up, result
from .registry import Registry
from .stopping import GracefulStop

POLL_SECONDS = 1.0  # longest idle wait between two claims (`bgq work --poll`)
POLL_MIN = 0.005  # first idle wait on MySQL after work was found
STOP_CHECK = 0.5  # an idle worker looks at its stop flag at least this often
HEADS_MAX = 50  # group heads one claim takes at most (finding more costs the claim more)
GROUPS_MAX = 50  # groups one worker keeps at most: the others are left to the other workers
CHAIN_SECONDS = 0.2  # a worker keeps a group this long at most, then lets better-priority work in
EMPTY_CLAIMS = 2  # cron mode: claims in a row that found nothing before the run ends


def work(
    queue: Parts,
    sub_queue: str | None = None,
    priorities: Sequence[int] | None = None,
    stop: GracefulStop | None = None,
    *,
    batch_max: int = BATCH_MAX,
    poll: float = POLL_SECONDS,
) -> int:
    """Run jobs until `stop.requested` (SIGTERM/SIGINT) or a DieException; return the exit code 0.

    `priorities`: only jobs whose priority lies between their min and max (None: all).
    """
    check(queue, batch_max=batch_max, poll=poll)
    base = queue.config.queue_name(sub_queue)
    _Worker(queue, base, priorities, stop or GracefulStop(), batch_max, poll).run()
    return 0


def check(
    queue: Parts,
    *,
    sub_queue: str | None = None,
    batch_max: int = BATCH_MAX,
    poll: float = POLL_SECONDS,
    **_: object,
) -> None:
    """Raise ConfigError if `work(queue, ...)` with these options cannot run (nothing is claimed)."""
    queue.config.served_queue(sub_queue)
    if queue.config.producer is not None:
        raise ConfigError("bgq work runs on the database alone; this queue has a broker: use `bgq consume`.")
    if batch_max < 1 or poll <= 0:
        raise ConfigError("bgq work needs --batch at least 1 and --poll greater than 0.")


def run_until_idle(queue: Parts, limit: int, deadline: float | None = None) -> tuple[int, bool, bool]:
    """Cron mode's pass (`bgq process` without a broker): the worker's loop, claiming at most
    `limit` jobs and none after `deadline` (time.monotonic()), ending when claims find nothing.
    Returns (jobs run, whether a claim or a result write failed, whether the deadline passed)."""
    worker = _Worker(
        queue,
        queue.config.queue,
        None,
        GracefulStop(),
        BATCH_MAX,
        POLL_SECONDS,
        limit=limit,
        deadline=deadline,
    )
    ran = worker.run()
    failed = worker.failed or worker.pipeline.failures > 0
    return ran, failed, deadline is not None and time.monotonic() >= deadline


class _Worker:
    def __init__(
        self, queue: Parts, base: str, priorities: Sequence[int] | None, stop: GracefulStop,
        batch_max: int, poll: float, *, limit: int | None = None, deadline: float | None = None,
    ) -> None:  # fmt: skip
        self.queue = queue
        self.store = queue.store
        self.executor = queue.executor
        self.log = queue.config.logger
        self.base = base
        self.low = min(priorities) if priorities else None
        self.high = max(priorities) if priorities else None
        self.stop = stop
        self.batch_max = batch_max
        self.poll = poll
        self.pid = os.getpid()
        self.batch = BatchSize(batch_max)
        self.pipeline = Pipeline.for_queue(
            queue, self._write, batch_max=batch_max, wait=STOP_CHECK, name="bgq-work-writer"
        )
        self.limit = limit  # cron mode: run at most this many jobs, stop when idle
        self.deadline = deadline  # cron mode: claim nothing after this time.monotonic()
        self.ran = 0  # jobs whose callback ran (cron mode's limit counts these and the held ones)
        self.failed = False  # cron mode: a claim failed (the run ended) or a result write failed
        # The groups this worker keeps (main thread only), each since when (time.monotonic()).
        self.kept: dict[str, float] = {}

    # --- main thread ---

    def run(self) -> int:
        """Work until stopped; the number of jobs run. Stalled jobs are reaped on a thread of the
        worker's own meanwhile (bgq/jobs/reaper.py), so no cron is needed for that."""
        self.store.procs  # noqa: B018 (checks the install in a transaction of its own, first)
        mode = WorkerMode.WORK if self.limit is None else WorkerMode.PROCESS
        with self.store.database.pinned(), Registry(self.queue, mode, self.base):  # bgq/modes/registry.py
            self.queue.reaper.start()  # once the database answered: a worker that cannot connect
            try:  # fails once, not once per thread
                self._loop()
            finally:
                self.queue.reaper.stop()
        return self.ran

    def _loop(self) -> None:
        waker = None if self.limit is not None else self.store.procs.waker()
        if self.limit is None and self.store.procs.polls:
            self.log.warning(
                "bgq: pooled (behind PgBouncer) without listen_url: idle workers poll for new jobs "
                f"(up to {self.poll:g} s apart) instead of waiting on LISTEN; set listen_url "
                "(BGQ_LISTEN_URL) to a direct PostgreSQL URL for wake-ups."
            )
        self.pipeline.start()
        idle = POLL_MIN
        empty = 0
        futile = -1  # pipeline.writes when a claim beside pending hand-offs last found nothing
        try:
            while not self.stop.requested and not self.executor.should_die:
                self.queue.scheduler.tick()  # fires due schedules, at most once a second
                held = self.pipeline.next()
                if held is not None:
                    self._run(held)
                    continue
                if not self.pipeline.caught_up():
                    continue
                room, held_now, keeping = self._room()
                if held_now:  # a hand-off ended meanwhile: run its jobs first
                    continue
                if keeping and (
                    not room
                    or self.pipeline.writes == futile
                    or len(self.pipeline.groups()) > GROUPS_MAX // 2
                ):
                    # Results being written claim their groups' next heads: wait for them when
                    # they fill this worker's room, when the last claim found nothing more and
                    # nothing was written since, or while the worker keeps more than half as
                    # many groups as it may (fewer, larger claims).
                    self.pipeline.flush(STOP_CHECK)
                    continue
                if not room:  # cron mode: its limit is reached, or its deadline passed
                    break
                writes = self.pipeline.writes  # writes ended before this claim began
                try:
                    if self._claim(room):
                        idle, empty = POLL_MIN, 0
                        continue
                    if keeping:  # the kept groups' heads are on their way: wait for them
                        futile = writes
                        continue
                except BgqError as exc:  # the database is down: log it, wait, try again
                    self.log.critical(f"bgq: Claiming jobs failed. ({exc})")
                    if self.limit is not None:  # cron mode: this run ends; the next one retries
                        self.failed = True
                        break
                    time.sleep(self.poll)
                    continue
                if self.pipeline.flush(STOP_CHECK) != writes:
                    # Results were written during the claim or were still being written: the
                    # groups they end may be free now, so claim again instead of waiting for a
                    # wake-up that may never come.
                    continue
                if self.limit is not None:
                    # A claim finds nothing while work remains when every candidate was taken
                    # by another worker first: stop after a few in a row.
                    empty += 1
                    if empty >= EMPTY_CLAIMS:
                        break
                    time.sleep(POLL_MIN * 2)
                    continue
                waker = self._idle(waker, idle)
                idle = min(idle * 2, self.poll)
        finally:
            self.pipeline.close()  # gives back the held jobs, writes every result
            if waker is not None:
                waker.close()

    def _room(self) -> tuple[int, int, int]:
        """(How many more jobs this worker may take on now, how many it holds, how many of the
        jobs it has taken on are still on their way): a claim's worth (`_size`) less the jobs
        held and those the results being written will hand on (read together), and in cron
        mode at most what its limit leaves; 0 past cron mode's deadline."""
        held, keeping = self.pipeline.ahead()
        room = self._size() - held - keeping
        if self.limit is not None:
            room = min(room, self.limit - self.ran - held - keeping)
        if self.deadline is not None and time.monotonic() >= self.deadline:
            room = 0
        return max(0, room), held, keeping

    def _idle(self, waker: Waker | None, idle: float) -> Waker | None:
        """Wait for work until a waker says jobs were published, or for `idle` seconds, in slices
        of at most STOP_CHECK seconds, so SIGTERM ends an idle worker promptly. `idle` starts at
        POLL_MIN after work was found and doubles up to `poll`: a claim can find nothing while
        work remains (another worker took every candidate it saw first), and no wake-up comes
        for that, so the worker looks again soon. A broken waker is replaced at the next wait."""
        if waker is None and self.limit is None:  # the last one broke: open another (or poll)
            with contextlib.suppress(Exception):
                waker = self.store.procs.waker()
        deadline = time.monotonic() + min(idle, self.queue.scheduler.wait_bound())  # a fire is due then
        try:
            while not self.stop.requested:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if waker is None:
                    time.sleep(min(left, STOP_CHECK))
                elif waker.wait(min(left, STOP_CHECK)):
                    break
            return waker
        except Exception as exc:  # the waker's connection broke: wait `poll`, then claim
            self.log.warning(
                f"bgq: The wake-up connection failed; reconnecting. ({' '.join(str(exc).split())})"
            )
            if waker is not None:
                waker.close()
            time.sleep(self.poll)
            return None

    def _size(self) -> int:
        """A claim's worth of jobs (pipeline.BatchSize)."""
        return self.batch()

    def _claim(self, size: int) -> int:
        """Claim up to `size` jobs and queue them; how many. Among them heads of up to HEADS_MAX
        idle groups, which this worker then keeps: each result of one is written with the
        group's next head claimed (`_run`, `_write`)."""
        started = time.monotonic()
        procs, waiting_ms = self.store.procs, self.queue.config.waiting_job_expiration
        owned = self.pipeline.groups()
        self.kept = {g: since for g, since in self.kept.items() if g in owned}  # (ended groups out)
        jobs = self.executor.retrying(
            lambda conn: procs.claim_batch(
                conn,
                self.base,
                size,
                self.pid,
                self.low,
                self.high,
                waiting_ms,
                max_heads=max(0, min(size, HEADS_MAX, GROUPS_MAX - len(owned))),
                worker_id=self.executor.worker_id,
                alone=True,
            )
        )
        for job in jobs:  # a group taken by a claim starts a new run of hand-offs
            if job.claim.serial_group is not None:
                self.kept.pop(job.claim.serial_group, None)
        self.pipeline.hold(jobs, started)  # behind the jobs held before them
        return len(jobs)

    def _run(self, held: Held) -> None:
        executor, job = self.executor, held.job
        started = time.monotonic()
        outcome = executor.run_held(job.id, job.claim, held.claimed_at, store_metadata=True)
        if outcome is None:
            return
        self.ran += 1
        self.batch.ran(time.monotonic() - started)
        group = job.claim.serial_group
        keep = group is not None and not outcome.die and self._keep(group)
        done = Done(job, outcome, executor.clone_delay(job.claim, outcome), keep)
        if group is not None and self.pipeline.holding() == 0 and self.pipeline.writer_idle():
            # Nothing else to run and the writer idle: write here, so the group's next job
            # starts (or the claim that follows finds the group free) as soon as this result is
            # committed (a lone group's chain).
            try:
                self._write([*self.pipeline.take(), done])
            except Exception as exc:  # as on the writer thread: the worker goes on
                self.log.critical("bgq: Writing results failed; going on.", exc_info=exc)
                self.failed = True
        else:
            self.pipeline.put(done)  # the writer writes it with the others
        if outcome.die:
            executor.should_die = True

    def _keep(self, group: str) -> bool:
        """Whether this worker claims `group`'s next head with the result it just ran (a
        hand-off): while it has room for the job (it holds fewer than one claim's worth, and
        in cron mode may still run it), and for at most CHAIN_SECONDS in a row, after which the
        group is let go, so that ungrouped jobs and other groups' heads of a better priority,
        and other workers, get their turn through a full claim."""
        if not self._room()[0]:  # (this job's successor would be one more)
            self.kept.pop(group, None)
            return False
        now = time.monotonic()
        if now - self.kept.setdefault(group, now) >= CHAIN_SECONDS:
            del self.kept[group]
            return False
        return True

    def _write(self, batch: list[Done]) -> None:
        """The one way `bgq work` writes results (the pipeline's write function on the writer
        thread; on the main thread for a lone group's hand-off): `{table}_hand_off`, which writes
        them and, in the same transaction, claims the next head of each group whose result is
        kept (`Done.keep`); the heads claimed are held to run next. Logs what each written
        result calls for."""
        executor, procs, cfg = self.executor, self.store.procs, self.queue.config
        results = [result(d) for d in batch]
        closing = self.pipeline.closing  # no head is claimed once the worker stops
        groups = sorted({g for d in batch if d.keep and not closing and (g := d.job.claim.serial_group)})

        def write(conn: Connection) -> tuple[dict[int, bool], list[Claimed]]:
            return procs.hand_off(
                conn,
                results,
                groups,
                self.base,
                self.pid,
                self.low,
                self.high,
                cfg.waiting_job_expiration,
                worker_id=executor.worker_id,
                alone=True,
            )

        claimed_at = time.monotonic()
        done = executor.persist(write, failure(batch))
        if done is None:
            return  # the jobs stay PROCESSING; the reaper gives them back after stalled_job_timeout
        written, successors = done
        self.pipeline.hold(successors, claimed_at)
        for d in batch:
            follow_up(executor, self.log, d, batch_answer(written, d.job.id))
