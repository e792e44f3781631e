"""Running jobs: cron mode's process(), and process_job(): claim, callback, finish (a Queue mixin)."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy.engine import Connection

from . import params as params_codec
from . import retry, runner
from .errors import BgqError, SerializationError
from .procs import ClaimResult, FinishResult
from .states import JobState, Mode

T = TypeVar("T")
PROCESS_LIMIT = 1000  # jobs per process() run, as in the original
PERSIST_PAUSES = (0.0, 0.05, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0)  # s before each try of a result write
CLAIM_TRIES = 5  # a deadlock or lock-wait timeout in the claim is retried this many times


@dataclass
class ProcessReport:
    """What one `process()` run did."""

    reaped: int = 0
    promoted: int = 0
    republished: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    timed_out: bool = False  # max_runtime was up: it stopped claiming before the end

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


class Processing:
    """Queue's processing side; Queue provides config, log, database, procs and the _send* methods."""

    def process(self, *, max_runtime: float | None = None) -> ProcessReport:
        """`bgq process` (cron): reap stalled jobs, then run due jobs inline, one at a time.

        Without a broker a run is `bgq work`'s loop that ends when it finds nothing to claim: it
        claims with `{table}_claim_batch` (ungrouped due jobs and the heads of idle groups, in
        (priority, id) order, then a group's next head by hand-off), so however many jobs wait
        below a group's head, the run only ever claims jobs that may run now, and PROCESS_LIMIT
        counts the jobs run; the worker's reaper thread keeps reaping during a long run. In broker
        mode it sends BACK_TO_BROKER jobs, runs BROKER_FAILED ones, promotes stuck groups' heads
        and re-sends lost messages.

        `max_runtime` (seconds; None: no limit): no job is started once that much time has passed
        since the call (a running job is not interrupted), so a run ends within about
        max_runtime plus one job; the report's `timed_out` says so.
        """
        deadline = None if max_runtime is None else time.monotonic() + max_runtime
        report = ProcessReport()
        report.reaped = len(self.reaper.run_once())
        if self.config.producer is None:
            self._process_claims(report, deadline)
        else:
            self._process_broker_pass(report, deadline)
        return report

    def _process_claims(self, report: ProcessReport, deadline: float | None) -> None:
        """Without a broker: `bgq work`'s loop (batch claims, group hand-offs, batched results)
        until claims find nothing, PROCESS_LIMIT jobs were claimed or `deadline` passed."""
        from .work import run_until_idle  # work.py builds on Queue, of which this is a part

        ran, failed, report.timed_out = run_until_idle(self, PROCESS_LIMIT, deadline)  # type: ignore[arg-type]
        if ran:
            report.outcomes["claimed"] = ran
        if failed:
            report.count("error")

    def _process_broker_pass(self, report: ProcessReport, deadline: float | None) -> None:
        procs, cfg = self.procs, self.config
        with self.database.transaction() as conn:
            released = procs.back_to_broker(conn, cfg.queue, PROCESS_LIMIT)
        self._send([(j.id, j.queue, j.priority, None) for j in released])
        with self.database.transaction() as conn:
            due = procs.due_jobs(conn, cfg.queue, True, PROCESS_LIMIT)
        for job in due:
            if self.should_die:
                break
            if deadline is not None and time.monotonic() >= deadline:
                report.timed_out = True
                break
            if job.state == JobState.BACK_TO_BROKER:
                continue  # published by back_to_broker above
            try:
                report.count(self.process_job(job.id))
            except BgqError as exc:
                self.log.critical(f"bgq: Unexpected error occurred. (ID: {job.id})", exc_info=exc)
                report.count("error")
        with self.database.transaction() as conn:
            promoted = procs.promote_waiting(conn)
        self._send([(j.id, j.queue, j.priority, None) for j in promoted])
        report.promoted = len(promoted)
        if cfg.lost_message_timeout:
            with self.database.transaction() as conn:
                lost = procs.lost_messages(conn, cfg.queue, cfg.lost_message_timeout, PROCESS_LIMIT)
            for job in lost:
                self.log.warning(f"bgq: Lost broker message republished (ID: {job.id}).")
            self._send([(j.id, j.queue, j.priority, None) for j in lost])
            report.republished = len(lost)

    def process_job(self, job_id: int, on_claimed: Callable[[], None] | None = None) -> str:
        """Claim one job, run its callback and write its result. Returns the claim's outcome.

        Outcomes: claimed (it ran), waiting, redundant, locked, missing, skipped, unexpected.
        `on_claimed` runs once the claim (or its refusal) is committed, before the callback: a
        consumer acknowledges its message there.
        """
        cfg = self.config
        metadata_json = None
        if cfg.on_processing_get_metadata is not None:
            metadata_json = self._metadata(job_id)
        claim = self._claim(job_id, metadata_json)
        if on_claimed is not None:
            on_claimed()
        if claim.promoted_id is not None:
            self._send_job(claim.promoted_id)
        if claim.outcome == "locked" and claim.queue is not None and claim.priority is not None:
            self._send([(job_id, claim.queue, claim.priority, None)])  # another worker holds the group
        if claim.outcome == "unexpected":
            self._log_unexpected(job_id, claim.state)
        if claim.outcome != "claimed":
            return claim.outcome
        self._execute(job_id, claim)
        return claim.outcome

    def _execute(self, job_id: int, claim: ClaimResult) -> None:
        """Run a claimed job's callback with heartbeats, then write its result."""
        self._heartbeat.start(job_id, claim.attempt or 0)
        try:
            outcome = self._run(job_id, claim)
        finally:
            self._heartbeat.stop()  # cleared before the result is written (SPEC B §1.5)
        self._finish(job_id, claim, outcome)

    def _log_unexpected(self, job_id: int, state: int | None) -> None:
        """A job that is not claimable, left alone and counted as "unexpected". PROCESSING is a
        race another worker won (a redelivered message, overlapping runs): normal, so INFO; any
        other state (PERMANENTLY_FAILED) at WARNING. Neither needs a person, so never CRITICAL."""
        level = logging.INFO if state == JobState.PROCESSING else logging.WARNING
        self.log.log(level, f'bgq: Unexpected state "{state}". (ID: {job_id})')

    def heartbeat(self) -> None:
        """Tell the reaper that the running job is alive: its updated_at moves to now.

        Call it from a long callback more often than `stalled_job_timeout`. It writes at most once
        per `heartbeat_interval` seconds (the claim counts as the first heartbeat; 0 writes on every
        call), through bgq's own connection, fenced on the job's claim: a job that was reaped, claimed
        again elsewhere or finished is left alone (and logged once at WARNING). Outside a job it does
        nothing. It never raises: a failure is logged at WARNING as 'bgq: Heartbeat failed (ID: n).'
        """
        self._heartbeat.beat()

    def install_heartbeat(self, engine: Any) -> Callable[[], None]:
        """Send heartbeats automatically from every statement run on the application's `engine`.

        Registers a SQLAlchemy "before_cursor_execute" listener on `engine` (an Engine; for an
        AsyncEngine, its sync_engine) that calls `heartbeat()`: any query a callback runs on the
        application's database keeps its job alive, throttled to one write per
        `heartbeat_interval`. Outside a job it is a cheap no-op, so the application's other
        statements are not slowed. The heartbeat itself runs on bgq's own engine, and a guard stops
        any recursion. Installing twice on one engine registers one listener. Returns a function
        that removes the listener.
        """
        return self._heartbeat.install(engine)

    def _metadata(self, job_id: int) -> str | None:
        with self.database.transaction() as conn:
            row = self.procs.get_job(conn, job_id)
        if row is None:
            return None
        parameters = params_codec.decode(
            row["parameters_json"], row["parameters"], allow_pickle=self.config.allow_pickle
        )
        return json.dumps(self.config.on_processing_get_metadata(parameters), default=str)

    def _store_metadata(self, job_id: int, attempt: int) -> None:
        """bgq work: store on_processing_get_metadata's value for a job claimed in a batch."""
        metadata_json = self._metadata(job_id)
        if metadata_json is not None:
            with self.database.transaction() as conn:
                self.procs.heartbeat(conn, job_id, attempt, metadata_json=metadata_json)

    def _claim(self, job_id: int, metadata_json: str | None) -> ClaimResult:
        cfg = self.config
        return self._retrying(
            lambda conn: self.procs.claim(
                conn, job_id, cfg.queue, os.getpid(), cfg.waiting_job_expiration, metadata_json
            )
        )

    def _retrying(self, call: Callable[[Connection], T]) -> T:
        """Run `call` in a transaction under bgq's retry policy (bgq/retry.py): a retryable error
        (lock timeout, deadlock, serialisation failure, lost connection) runs it again, CLAIM_TRIES
        attempts in all."""
        return retry.in_transaction(self.database, call, tries=CLAIM_TRIES)

    def _run(self, job_id: int, claim: ClaimResult) -> runner.Outcome:
        cfg = self.config
        spec = cfg.callbacks.get(claim.callback_name or "")
        if spec is None:
            message = f'Callback "{claim.callback_name}" does not exist.'
            self.log.critical(f"bgq: {message} (ID: {job_id})")
            return runner.Outcome(JobState.PERMANENTLY_FAILED, message)
        try:
            parameters = params_codec.decode(
                claim.parameters_json, claim.parameters, allow_pickle=cfg.allow_pickle
            )
        except (SerializationError, ValueError) as exc:
            return runner.Outcome(JobState.PERMANENTLY_FAILED, runner.describe(exc), exception=exc)
        return runner.run(spec.func, parameters, claim.attempt or 0, cfg)

    def _finish(
        self,
        job_id: int,
        claim: ClaimResult,
        outcome: runner.Outcome,
        then: Callable[[Connection], T] | None = None,
    ) -> T | None:
        """Write the job's result (retrying hard: the callback has run), then log and publish what
        follows from it. `then` runs in the same transaction after the finish (bgq work hands a
        group on to its next job there); its value is returned."""
        memory = json.dumps(outcome.memory) if outcome.memory is not None else None
        clone_delay = self._clone_delay(claim, outcome)

        def write(conn: Connection) -> tuple[FinishResult, T | None]:
            result = self.procs.finish(
                conn, job_id, claim.attempt or 0, int(outcome.state), outcome.error,
                outcome.postponed_by, outcome.execution_time, memory, clone_delay_ms=clone_delay,
            )  # fmt: skip
            return result, (then(conn) if then is not None else None)

        written = self._persist(write, f"bgq: Writing the result failed; retrying. (ID: {job_id})")
        if outcome.die:
            self.should_die = True
        if written is None:
            return None
        self._after_finish(job_id, claim, outcome, written[0], clone_delay)
        return written[1]

    def _persist(self, call: Callable[[Connection], T], failure: str) -> T | None:
        """Run `call` in a transaction, trying hard (the callback has run): after a failure wait
        PERSIST_PAUSES and try again; None if all failed (the job stays PROCESSING until the reaper
        takes it back). The first retries come fast: a cut session or a deadlock is cured at once,
        and a result must not wait so long that the reaper takes the job it belongs to. A retryable
        error (deadlock, lock timeout, lost connection) is logged at WARNING, with `failure` as the
        message; a non-retryable one, and the last failure, at CRITICAL with its traceback."""
        for attempt, pause in enumerate(PERSIST_PAUSES):
            time.sleep(pause)
            try:
                with self.database.transaction() as conn:
                    return call(conn)
            except BgqError as exc:
                if attempt == len(PERSIST_PAUSES) - 1:
                    self.log.critical(f"{failure} Gave up after {attempt + 1} attempts.", exc_info=exc)
                elif retry.retryable(exc):
                    self.log.warning(f"{failure} ({exc})")
                else:
                    self.log.critical(failure, exc_info=exc)
        return None

    def _clone_delay(self, claim: ClaimResult, outcome: runner.Outcome) -> int | None:
        """A RECURRING job that finished (a Skip too) and a WaitingException both leave a fresh copy,
        due after waiting_job_expiration; the finish procedure inserts it in the same transaction."""
        recurring_done = claim.mode == Mode.RECURRING and outcome.state is JobState.FINISHED
        return self.config.waiting_job_expiration if (outcome.clone or recurring_done) else None

    def _after_finish(
        self, job_id: int, claim: ClaimResult, outcome: runner.Outcome, result: FinishResult,
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
        if outcome.state is JobState.TEMPORARILY_FAILED:
            self._send([(job_id, claim.queue or cfg.queue, claim.priority or 0, outcome.postponed_by)])
        if result.promoted_id is not None:
            self._send([(result.promoted_id, result.promoted_queue, result.promoted_priority, None)])
        if result.clone_id is not None:
            self._send([(result.clone_id, claim.queue or cfg.queue, claim.priority or 0, clone_delay)])
