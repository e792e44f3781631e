"""`bgq consume`: job ids from the broker in batches, claimed together, acknowledged, run, written together.

One consumer process runs one job at a time on its main thread and keeps a second thread, the
writer, for the results (bgq/modes/pipeline.py, shared with `bgq work`: held jobs, the writer thread,
give-backs, backpressure):

- Messages: `take_batch` takes up to `size` ids from the most preferred queue that has messages
  waiting (the control queue first; a batch comes from one queue, so priorities are kept batch by
  batch). `size` adapts to how long jobs take, so that one batch holds about BATCH_BUDGET
  seconds of work (1 for slow jobs, up to `batch_max` for fast ones).
- Claims: the batch's ids are claimed by `{table}_claim_ids` in ONE transaction (ungrouped jobs
  by one set-based write; the first grouped job through `{table}_claim_job`, as a single claim);
  every later grouped job of the batch is 'deferred' and claimed by `{table}_claim` in a
  transaction of its own, so one transaction never holds two groups' locks. A duplicate id is
  'unexpected' or 'skipped', a job behind its group's running job turns WAITING: two jobs of one
  group taken together never run together and run in their group's order. Each message is
  acknowledged once the transaction that claimed (or refused) its job has committed (README,
  "What broker mode guarantees"): a crash before the commit loses nothing (RabbitMQ delivers the
  message again), a crash after it leaves the claimed jobs PROCESSING for the reaper, and a
  redelivered duplicate finds its job claimed and changes nothing.
- Results: each job's result goes to the writer thread, which writes whatever has accumulated in
  one transaction while the main thread runs the next job (group commit): `{table}_finish_batch`
  for ungrouped jobs without a copy (nothing to publish after them), `{table}_finish` for the
  others (their promoted successor or copy is published once the transaction has committed).
  No batch is taken while `batch_max` results wait to be written (backpressure). An exception out
  of one write is logged at CRITICAL and the writer goes on; one job's failing follow-up costs no
  other job its own.
- A claimed job that has not started within pipeline.HOLD_SECONDS (and half of stalled_job_timeout) is
  given back (state READY, attempts restored) by the writer and its id sent again, so a slow job
  never holds the rest of its batch hostage. SIGTERM / SIGINT: the running job finishes and its
  result is written, the unstarted claimed jobs are given back the same way, then the process
  exits 0.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Sequence

from sqlalchemy.engine import Connection

from ..broker import DIE, BrokerError, Consumer, Delivery
from ..errors import BgqError, ConfigError
from ..model import Claimed, ClaimResult, FinishResult, Message, WorkerMode
from .parts import Parts
from .pipeline import (
    BATCH_BUDGET,
    BATCH_MAX,
    BatchSize,
    Done,
    Held,
    Pipeline,
    batch_answer,
    failure,
    follow_up,
    result,
)
from .registry import Registry
from .stopping import GracefulStop

#: Seconds one take() waits before the loop looks at its stop flag again.
POLL_SECONDS = 1.0
#: The first estimate of a job's duration: "slow", so the first batch is one message, and the
#: batches grow as jobs prove fast.
FIRST_ESTIMATE = BATCH_BUDGET


def consume(
    queue: Parts, sub_queue: str | None, jobs: int, priorities: Sequence[int], stop: GracefulStop,
    *, batch_max: int = BATCH_MAX,
) -> int:  # fmt: skip
    """Handle `jobs` messages (0: until stopped) and return the process exit code (0)."""
    producer = queue.config.producer
    if producer is None or not hasattr(producer, "consumer"):
        raise ConfigError(
            "consume needs a broker: configure the queue with producer=bgq.broker.rabbitmq.RabbitMQ(...)."
        )
    if batch_max < 1:
        raise ConfigError("consume needs a batch of at least 1 message.")
    consumer: Consumer = producer.consumer()
    base = queue.config.served_queue(sub_queue)
    registry = Registry(queue, WorkerMode.CONSUME, base)  # listed in {table}_worker (bgq/modes/registry.py)
    registry.start()
    queue.reaper.start()  # stalled jobs are reaped without cron (bgq/jobs/reaper.py)
    try:
        with queue.store.database.pinned():
            _Loop(queue, consumer, base, priorities, stop, jobs, batch_max).run()
    finally:
        queue.reaper.stop()
        registry.stop()
        consumer.close()
    return 0


class _Loop:
    def __init__(
        self, queue: Parts, consumer: Consumer, base: str, priorities: Sequence[int],
        stop: GracefulStop, jobs: int, batch_max: int,
    ) -> None:  # fmt: skip
        self.queue = queue
        self.config = queue.config
        self.store = queue.store
        self.executor = queue.executor
        self.log = queue.config.logger
        self.consumer = consumer
        self.base = base
        self.priorities = list(priorities)
        self.stop = stop
        self.jobs = jobs
        self.batch_max = batch_max
        self.pid = os.getpid()
        self.handled = 0  # messages handled (`-j N` counts these)
        self.batch = BatchSize(batch_max, FIRST_ESTIMATE)
        self.pipeline = Pipeline.for_queue(
            queue, self._write, batch_max=batch_max, wait=POLL_SECONDS, name="bgq-consume-writer"
        )

    # --- main thread ---

    def run(self) -> None:
        self.pipeline.start()
        try:
            while not self._finished():
                self.queue.scheduler.tick()  # fires due schedules, at most once a second
                held = self.pipeline.next()
                if held is not None:
                    self._run(held)
                    continue
                if not self.pipeline.caught_up():  # backpressure
                    continue
                if self._take() == "die":
                    return
        finally:
            self.pipeline.close()  # gives back the held jobs (their ids sent again), writes every result

    def _finished(self) -> bool:
        if self.stop.requested or self.executor.should_die:
            return True
        return self.jobs != 0 and self.handled >= self.jobs and not self.pipeline.holding()

    def _size(self) -> int:
        size = self.batch()
        return size if self.jobs == 0 else max(1, min(size, self.jobs - self.handled))

    def _wait(self) -> float:
        """How long a take may wait for messages: POLL_SECONDS, or less when a schedule fires sooner."""
        return max(0.01, min(POLL_SECONDS, self.queue.scheduler.wait_bound()))

    def _take(self) -> str | None:
        """Take a batch of messages, claim their jobs in one transaction, acknowledge them and
        hold the claimed jobs; "die" when a die message asks the process to exit."""
        try:
            deliveries = list(
                self.consumer.take_batch(self.base, self.priorities, self._size(), self._wait())
            )
        except BrokerError as exc:  # the next take reconnects
            self.log.error(f"bgq: The broker connection failed; reconnecting. ({exc})")
            time.sleep(POLL_SECONDS)
            return None
        if not deliveries:
            return None
        if deliveries[0].body == DIE:  # a batch comes from one queue: the control queue's
            for other in deliveries[1:]:
                other.reject()  # one die message per consumer: the others are for other consumers
            deliveries[0].ack()
            self.handled += 1
            self.log.info("bgq: die message received; the consumer exits.")
            return "die"
        ids: list[tuple[Delivery, int]] = []
        for delivery in deliveries:
            try:
                ids.append((delivery, int(delivery.body)))
            except ValueError:
                self.log.error(f"bgq: Ignoring a message that is not a job id: {delivery.body[:100]!r}")
                delivery.ack()
                self.handled += 1
        if ids:
            self._claim(ids)
        return None

    def _claim(self, ids: list[tuple[Delivery, int]]) -> None:
        """Claim the batch's jobs: `{table}_claim_ids` in one transaction, then each job it
        deferred (a grouped job after the first) with `{table}_claim` in a transaction of its own
        (every job that way when on_processing_get_metadata is set: its value is per job); then
        acknowledge every message whose claim committed and give back the others."""
        executor, procs, cfg = self.executor, self.store.procs, self.config
        # Each id once (a message sent twice, e.g. by the lost-message pass, may come twice in
        # one batch: the copy is acknowledged with it), in id order (every batch locks the job
        # rows in that order).
        job_ids = sorted({job_id for _, job_id in ids})
        waiting_ms, worker_id = cfg.waiting_job_expiration, executor.worker_id
        claims: dict[int, ClaimResult] = {}
        failed: set[int] = set()
        claimed_at = time.monotonic()
        if cfg.on_processing_get_metadata is None:
            try:
                claimed = executor.retrying(
                    lambda conn: procs.claim_ids(
                        conn, job_ids, cfg.queue, self.pid, waiting_ms, worker_id=worker_id
                    )
                )
                claims = {i: c for i, c in claimed if c.outcome != "deferred"}
            except BgqError as exc:  # the claim failed (database down?): give the messages back
                self.log.critical(f"bgq: Unexpected error occurred. (IDs: {job_ids})", exc_info=exc)
                failed = set(job_ids)
        for job_id in job_ids:
            if job_id in claims or job_id in failed:
                continue
            try:
                metadata = executor.metadata(job_id) if cfg.on_processing_get_metadata else None
                claims[job_id] = executor.retrying(
                    functools.partial(
                        procs.claim,
                        job_id=job_id,
                        queue=cfg.queue,
                        pid=self.pid,
                        waiting_ms=waiting_ms,
                        metadata_json=metadata,
                        worker_id=worker_id,
                    )  # fmt: skip
                )
            except BgqError as exc:
                self.log.critical(f"bgq: Unexpected error occurred. (ID: {job_id})", exc_info=exc)
                failed.add(job_id)
        now = time.monotonic()  # the claims have committed: the hold counts from here
        held = []
        for job_id, claim in claims.items():
            self.executor.follow_up_claim(job_id, claim)
            if claim.outcome == "claimed":
                held.append(Claimed(job_id, claim))
        for delivery, job_id in ids:
            if job_id in failed:
                delivery.reject()
            else:
                _ack(delivery, self.log)  # the claim, or its refusal, has committed
        self.handled += len(ids)
        self.pipeline.hold(held, claimed_at, now)
        if failed:
            time.sleep(POLL_SECONDS)

    def _run(self, held: Held) -> None:
        executor, job = self.executor, held.job
        started = time.monotonic()
        outcome = executor.run_held(job.id, job.claim, held.claimed_at)
        if outcome is None:
            return
        self.batch.ran(time.monotonic() - started)
        self.pipeline.put(Done(job, outcome, executor.clone_delay(job.claim, outcome)))
        if outcome.die:
            executor.should_die = True

    def _write(self, batch: list[Done]) -> None:
        """The pipeline's write function, on its writer thread. Writes `batch`: the results of
        ungrouped jobs without a copy in one transaction (`{table}_finish_batch`: nothing is
        published after them but a give-back's id), every other result in a transaction of its
        own (`{table}_finish`, which says what to publish, a grouped job's give-back included:
        the job its group promoted meanwhile is sent with it; a transaction holding several
        groups' locks would deadlock with other workers, as the claims' 'deferred' explains);
        then publishes what each written result calls for."""
        plain = [d for d in batch if _publishes_nothing(d)]
        if plain:
            self._write_results(plain)
        for d in batch:
            if not _publishes_nothing(d):
                self._write_results([d])

    def _write_results(self, batch: list[Done]) -> None:
        executor, procs = self.executor, self.store.procs

        def write(conn: Connection) -> dict[int, FinishResult]:
            if len(batch) > 1:  # ungrouped results without a copy: nothing to publish after them
                written = procs.finish_batch(conn, [result(d) for d in batch])
                return {d.job.id: batch_answer(written, d.job.id) for d in batch}
            (first,) = batch
            one = result(first)  # a give-back is state READY: it wakes a group as a result does
            finished = procs.finish(
                conn, one.id, one.attempt, one.state, one.error, one.postponed_by, one.execution_time,
                json.dumps(one.memory) if one.memory is not None else None,
                clone_delay_ms=one.clone_delay_ms,
            )  # fmt: skip
            return {first.job.id: finished}

        results = executor.persist(write, failure(batch))
        if results is None:
            return  # the jobs stay PROCESSING; the reaper gives them back after stalled_job_timeout
        given_back: list[Message] = []
        for d in batch:
            job, written = d.job, results[d.job.id]
            if d.outcome is not None:
                follow_up(executor, self.log, d, written)  # a failure costs the others nothing
            elif written.finished:  # given back: its message was acknowledged, so it is sent again
                given_back.append(Message(job.id, job.claim.queue or self.base, job.claim.priority or 0))
                if written.promoted_id is not None:  # and the job its group promoted meanwhile
                    given_back.append(
                        Message(
                            written.promoted_id,
                            written.promoted_queue or self.base,
                            written.promoted_priority or 0,
                            None,
                        )
                    )
        if given_back:
            executor.sender.send(given_back)


def _publishes_nothing(done: Done) -> bool:
    """An ungrouped job without a copy: its result promotes nothing and copies nothing, so it is
    written with the others in one finish_batch."""
    return done.job.claim.serial_group is None and done.clone_delay_ms is None


def _ack(delivery: Delivery, log: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
    """Acknowledge after the claim committed. If that fails the broker redelivers the id, and the
    claim already decided who runs the job: the duplicate is 'unexpected' or 'skipped' and is
    dropped, so the job still runs exactly once. A failed ack never stops this job."""
    try:
        delivery.ack()
    except BrokerError as exc:
        log.warning(f"bgq: Acknowledging a message failed; its duplicate will be dropped. ({exc})")
