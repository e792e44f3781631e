"""Runs claimed jobs: the callback with its hooks and heartbeat, then its result, written and followed up."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.engine import Connection

from .. import metrics
from ..config import Config
from ..errors import BgqError, DatabaseUnavailableError, SerializationError
from ..model import ClaimResult, FinishResult, JobState, Message, Mode, Outcome
from ..sql import retry
from ..sql.database import Store
from . import coroutines
from . import params as params_codec
from .callback import describe
from .callback import run as run_callback
from .heartbeat import Heartbeat
from .sender import Sender

T = TypeVar("T")
CLAIM_TRIES = 5  # a deadlock or lock-wait timeout in the claim is retried this many times
PAUSED_RETRY_MS = 5000  # broker mode: a paused job's message is sent back, due again after this


class Executor:
    """One queue's executor. Every worker mode runs a job through it: `process_job` claims one job
    by id and writes its result with `finish` (broker mode, cron's broker pass); `bgq work` claims
    and writes in batches itself (bgq/modes/work.py) and calls `run`, `clone_delay` and `after_finish`.
    `should_die` turns True after a DieException: every worker loop stops claiming then."""

    def __init__(self, config: Config, store: Store, sender: Sender) -> None:
        self.config = config
        self.store = store
        self.sender = sender
        self.log = config.logger
        self.heartbeat = Heartbeat(config, store)  # the running job's proof of life (bgq/jobs/heartbeat.py)
        self.should_die = False
        #: This process's id in {table}_worker while registered (bgq/modes/registry.py), else None: the
        #: claims store it in the jobs they claim (their p_worker_id).
        self.worker_id: int | None = None
        self.current_job_id: int | None = None  # the job whose callback runs now (the registry reports it)
        self.jobs_done = 0  # jobs run by this process (the registry reports it)

    # --- one job by id ---

    def process_job(self, job_id: int, on_claimed: Callable[[], None] | None = None) -> str:
        """Queue.process_job (its docstring is the contract)."""
        cfg = self.config
        metadata_json = None
        if cfg.on_processing_get_metadata is not None:
            metadata_json = self.metadata(job_id)
        claimed_at = time.monotonic()
        claim = self.retrying(
            lambda conn: self.store.procs.claim(
                conn,
                job_id,
                cfg.queue,
                os.getpid(),
                cfg.waiting_job_expiration,
                metadata_json,
                worker_id=self.worker_id,
            )
        )
        if on_claimed is not None:
            on_claimed()
        self.follow_up_claim(job_id, claim)
        if claim.outcome != "claimed":
            return claim.outcome
        outcome = self.run_held(job_id, claim, claimed_at)
        if outcome is None:
            return "taken_over"
        self.finish(job_id, claim, outcome)
        return claim.outcome

    def follow_up_claim(self, job_id: int, claim: ClaimResult) -> None:
        """What a claim's outcome asks of the caller, in every mode: publish the job it promoted,
        send a locked job's id again (another worker holds its group), send a paused job's id
        back after PAUSED_RETRY_MS (broker mode), log an unexpected one."""
        if claim.promoted_id is not None:
            self.sender.send_job(claim.promoted_id)
        if claim.outcome == "locked" and claim.queue is not None and claim.priority is not None:
            self.sender.send([Message(job_id, claim.queue, claim.priority)])  # another worker holds the group
        if claim.outcome == "paused" and claim.queue is not None and claim.priority is not None:
            # Its queue or group is paused: the message comes back after a while.
            self.sender.send([Message(job_id, claim.queue, claim.priority, PAUSED_RETRY_MS)])
        if claim.outcome == "unexpected":
            self._log_unexpected(job_id, claim.state)

    def run_held(
        self, job_id: int, claim: ClaimResult, claimed_at: float, *, store_metadata: bool = False
    ) -> Outcome | None:
        """Run a job this worker holds (claimed at `claimed_at`, time.monotonic()), in every mode:
        None if the claim is no longer ours (the reaper took it while it waited); else its
        metadata stored when `store_metadata` and the option asks for it, the callback run
        under the heartbeat, which stops before the result is written (SPEC B §1.5), and its
        outcome. The caller writes the result."""
        attempt = claim.attempt or 0
        if not self.still_ours(job_id, attempt, claimed_at):
            return None
        if store_metadata and self.config.on_processing_get_metadata is not None:
            self.store_metadata(job_id, attempt)
        self.heartbeat.start(job_id, attempt, claimed_at=claimed_at)
        try:
            return self.run(job_id, claim)
        finally:
            self.heartbeat.stop()

    def _log_unexpected(self, job_id: int, state: int | None) -> None:
        """A job that is not claimable, left alone and counted as "unexpected". PROCESSING is a
        race another worker won (a redelivered message, overlapping runs): normal, so INFO; any
        other state (PERMANENTLY_FAILED) at WARNING. Neither needs a person, so never CRITICAL."""
        level = logging.INFO if state == JobState.PROCESSING else logging.WARNING
        self.log.log(level, f'bgq: Unexpected state "{state}". (ID: {job_id})')

    # --- the steps every mode shares ---

    def still_ours(self, job_id: int, attempt: int, claimed_at: float) -> bool:
        """Whether a claimed job may start now. A claim older than half of the shortest reaping
        bound (stalled_job_timeout, and worker_dead_after while this process is registered;
        `claimed_at`: time.monotonic() before the claim, which counts the time a process spent
        stopped) may have been reaped and run by another worker while this one was frozen, or
        while its claim or acknowledgement was slow. One transaction then renews this worker's
        row (so the dead-worker reap stops here) and makes a fenced heartbeat of the job, which
        says whether the claim still holds, and renews it, before the callback starts. A job
        taken over is left alone (logged at WARNING); one whose check fails on the database is
        left to the reaper."""
        bounds = [self.config.stalled_job_timeout]
        if self.worker_id is not None:
            bounds.append(self.config.worker_dead_after)
        bounds = [b for b in bounds if b]
        if not bounds or time.monotonic() - claimed_at <= min(bounds) / 2:
            return True
        worker_id, procs = self.worker_id, self.store.procs

        def check(conn: Connection) -> bool:
            if worker_id is not None:
                procs.worker_heartbeat(conn, worker_id, self.current_job_id, self.jobs_done)
            return procs.heartbeat(conn, job_id, attempt)

        try:
            alive = self.retrying(check)
        except BgqError as exc:
            self.log.warning(
                f"bgq: Checking a late job's claim failed; left to the reaper. (ID: {job_id}) ({exc})"
            )
            return False
        if not alive:
            self.log.warning(
                f"bgq: The job was taken over before it started (reaped while this worker was held "
                f"up); left alone. (ID: {job_id})"
            )
        return alive

    def metadata(self, job_id: int) -> str | None:
        """on_processing_get_metadata's value for the job, as JSON (None: no such job)."""
        store = self.store
        with store.database.transaction() as conn:
            row = store.procs.get_job(conn, job_id)
        if row is None:
            return None
        parameters = params_codec.decode(
            row["parameters_json"], row["parameters"], allow_pickle=self.config.allow_pickle
        )
        hook = self.config.on_processing_get_metadata
        return json.dumps(coroutines.resolve(hook(parameters)) if hook is not None else None, default=str)

    def store_metadata(self, job_id: int, attempt: int) -> None:
        """bgq work: store on_processing_get_metadata's value for a job claimed in a batch."""
        metadata_json = self.metadata(job_id)
        if metadata_json is not None:
            with self.store.database.transaction() as conn:
                self.store.procs.heartbeat(conn, job_id, attempt, metadata_json=metadata_json)

    def retrying(self, call: Callable[[Connection], T]) -> T:
        """Run `call` in a transaction under bgq's retry policy (bgq/sql/retry.py): a retryable error
        (lock timeout, deadlock, serialisation failure, lost connection) runs it again, CLAIM_TRIES
        attempts in all."""
        return retry.in_transaction(self.store.database, call, tries=CLAIM_TRIES)

    def run(self, job_id: int, claim: ClaimResult) -> Outcome:
        """The callback, with the queue's hooks (bgq/jobs/callback.py): its outcome, never an exception.
        Counted for the worker registry and the metrics, and logged at INFO with the job's fields
        (`extra`: job_id, callback, queue, group, attempt, outcome, duration_ms; bgq/logfmt.py); a
        temporary failure at WARNING, with its error and when it is retried; a run whose job was
        taken over (reaped and claimed by another worker while it ran) at WARNING, as dropped."""
        self.current_job_id = job_id
        started = time.monotonic()
        try:
            outcome = self._run(job_id, claim)
        finally:
            self.current_job_id = None
            self.jobs_done += 1
        seconds = time.monotonic() - started
        queue, callback = claim.queue or self.config.queue, claim.callback_name or ""
        fields = {
            "job_id": job_id,
            "callback": callback,
            "queue": queue,
            "group": claim.serial_group,
            "attempt": claim.attempt,
            "outcome": outcome.state.name.lower(),
            "duration_ms": round(seconds * 1000, 3),
        }
        if self.heartbeat.lost:  # reaped and claimed by another worker: no retry, the new owner runs it
            self.log.warning(
                f"bgq: Job was taken over by another worker; its result is dropped. (ID: {job_id})",
                extra=fields,
            )
        elif outcome.state is JobState.TEMPORARILY_FAILED:  # a retry is due: say why, at WARNING
            fields["error"] = outcome.error
            when = f", retried in {outcome.postponed_by / 1000:g} s" if outcome.postponed_by else ""
            self.log.warning(
                f"bgq: Job ran: {fields['outcome']}{when}: {outcome.error} (ID: {job_id})", extra=fields
            )
        else:
            self.log.info(f"bgq: Job ran: {fields['outcome']}. (ID: {job_id})", extra=fields)
        if metrics.enabled():
            metrics.record_job(queue, callback, outcome.state, seconds, self._wait(job_id))
        return outcome

    def _wait(self, job_id: int) -> float | None:
        """The job's wait (first claim minus due time) for the metrics; None on a database error."""
        try:
            with self.store.database.transaction() as conn:
                return self.store.procs.job_wait_seconds(conn, job_id)
        except BgqError:
            return None

    def _run(self, job_id: int, claim: ClaimResult) -> Outcome:
        cfg = self.config
        spec = cfg.callbacks.get(claim.callback_name or "")
        if spec is None:
            message = f'Callback "{claim.callback_name}" does not exist.'
            self.log.critical(f"bgq: {message} (ID: {job_id})")
            return Outcome(JobState.PERMANENTLY_FAILED, message)
        try:
            parameters = params_codec.decode(
                claim.parameters_json, claim.parameters, allow_pickle=cfg.allow_pickle
            )
        except (SerializationError, ValueError) as exc:
            return Outcome(JobState.PERMANENTLY_FAILED, describe(exc), exception=exc)
        outcome = run_callback(spec.func, parameters, claim.attempt or 0, cfg)
        if self.heartbeat.aborted is not None:  # cancelled while it ran (bgq.JobAborted)
            return Outcome(JobState.REDUNDANT, self.heartbeat.aborted)
        return outcome

    def finish(self, job_id: int, claim: ClaimResult, outcome: Outcome) -> None:
        """Write the job's result with `{table}_finish` (retrying hard: the callback has run), then
        log and publish what follows from it."""
        memory = json.dumps(outcome.memory) if outcome.memory is not None else None
        clone_delay = self.clone_delay(claim, outcome)
        result = self.persist(
            lambda conn: self.store.procs.finish(
                conn,
                job_id,
                claim.attempt or 0,
                int(outcome.state),
                outcome.error,
                outcome.postponed_by,
                outcome.execution_time,
                memory,
                clone_delay_ms=clone_delay,
            ),  # fmt: skip
            f"bgq: Writing the result failed; retrying. (ID: {job_id})",
        )
        if outcome.die:
            self.should_die = True
        if result is not None:
            self.after_finish(job_id, claim, outcome, result, clone_delay)

    def persist(self, call: Callable[[Connection], T], failure: str) -> T | None:
        """Run `call` in a transaction, trying hard (the callback has run): after a failure wait
        and try again (retry.persist_policy, its pauses retry.PERSIST_PAUSES); None if all failed
        (the job stays PROCESSING until the reaper takes it back). A retryable
        error (deadlock, lock timeout, lost connection) is logged at WARNING, with `failure` as the
        message; a non-retryable one, and the last failure, at CRITICAL with its traceback (a
        DatabaseUnavailableError, the database out of reach during a failover, at WARNING while
        it retries and without a traceback)."""

        def retried(exc: BgqError) -> None:
            # The database out of reach (a failover, a restart) is no bug: one line, no traceback.
            if retry.retryable(exc) or isinstance(exc, DatabaseUnavailableError):
                self.log.warning(f"{failure} ({exc})")
            else:
                self.log.critical(failure, exc_info=exc)

        def attempt() -> T:
            with self.store.database.transaction() as conn:
                return call(conn)

        try:
            return retry.persist_policy(retried)(attempt)
        except BgqError as exc:
            unreachable = isinstance(exc, DatabaseUnavailableError)
            gave_up = f"{failure} Gave up after {len(retry.PERSIST_PAUSES)} attempts."
            self.log.critical(
                f"{gave_up} ({exc})" if unreachable else gave_up, exc_info=None if unreachable else exc
            )
            return None

    def clone_delay(self, claim: ClaimResult, outcome: Outcome) -> int | None:
        """A RECURRING job that finished (a Skip too) and a WaitingException both leave a fresh copy,
        due after waiting_job_expiration; the result's writer ({table}_finish_results) inserts it
        in the same transaction."""
        recurring_done = claim.mode == Mode.RECURRING and outcome.state is JobState.FINISHED
        return self.config.waiting_job_expiration if (outcome.clone or recurring_done) else None

    def after_finish(
        self, job_id: int, claim: ClaimResult, outcome: Outcome, result: FinishResult,
        clone_delay: int | None,
    ) -> None:  # fmt: skip
        """Log what the written result calls for and publish its follow-ups in broker mode."""
        cfg = self.config
        if not result.finished:
            self.log.warning(
                f"bgq: The job was taken over while it ran; its result is dropped. (ID: {job_id})"
            )
            return
        attempts = claim.attempt or 0
        if outcome.state is JobState.TEMPORARILY_FAILED:
            if cfg.notify_on_number_of_attempts and attempts == cfg.notify_on_number_of_attempts:
                self.log.critical(
                    f'bgq: Number of attempts reached "{attempts}". (ID: {job_id})',
                    exc_info=outcome.exception,
                )
        elif outcome.state is JobState.PERMANENTLY_FAILED:
            self.log.critical(f"bgq: Permanent error occurred. (ID: {job_id})", exc_info=outcome.exception)
        send = self.sender.send
        if outcome.state is JobState.TEMPORARILY_FAILED:
            send([Message(job_id, claim.queue or cfg.queue, claim.priority or 0, outcome.postponed_by)])
        if result.promoted_id is not None:
            send(
                [
                    Message(
                        result.promoted_id,
                        result.promoted_queue or cfg.queue,
                        result.promoted_priority or 0,
                        None,
                    )
                ]
            )
        if result.clone_id is not None:
            send([Message(result.clone_id, claim.queue or cfg.queue, claim.priority or 0, clone_delay)])

    # --- for callbacks ---

    def install_heartbeat(self, engine: Any) -> Callable[[], None]:
        """Queue.install_heartbeat (its docstring is the contract)."""
        return self.heartbeat.install(engine)
