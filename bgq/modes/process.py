"""`bgq process` (cron): one pass that reaps, then runs due jobs inline until none is left or time is up."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..errors import BgqError
from ..model import JobState, Message, WorkerMode
from ..sql import retry
from .parts import Parts
from .registry import Registry
from .work import run_until_idle

PROCESS_LIMIT = 1000  # jobs per process() run, as in the original


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


def process(parts: Parts, *, max_runtime: float | None = None) -> ProcessReport:
    """Queue.process (its docstring is the contract): reap, then the pass of the queue's mode."""
    deadline = None if max_runtime is None else time.monotonic() + max_runtime
    report = ProcessReport()
    report.reaped = len(parts.reaper.run_once())
    with Registry(parts, WorkerMode.PROCESS, parts.config.queue):  # listed in {table}_worker
        parts.scheduler.tick()  # fires due schedules (the claims pass ticks again while it runs)
        if parts.config.producer is None:
            _claims_pass(parts, report, deadline)
        else:
            _broker_pass(parts, report, deadline)
    return report


def _claims_pass(parts: Parts, report: ProcessReport, deadline: float | None) -> None:
    """Without a broker: `bgq work`'s loop (batch claims, group hand-offs, batched results)
    until claims find nothing, PROCESS_LIMIT jobs were run or `deadline` passed."""
    ran, failed, report.timed_out = run_until_idle(parts, PROCESS_LIMIT, deadline)
    if ran:
        report.outcomes["claimed"] = ran
    if failed:
        report.count("error")


def _broker_pass(parts: Parts, report: ProcessReport, deadline: float | None) -> None:
    """With a broker: send BACK_TO_BROKER jobs, run due BROKER_FAILED ones (and the other due
    states) one by one, promote stuck groups' heads and re-send lost messages."""
    cfg, store, send, executor = parts.config, parts.store, parts.sender.send, parts.executor
    procs = store.procs
    db = store.database  # each step in a transaction of its own, run again on a deadlock (retry.py)
    released = retry.in_transaction(db, lambda conn: procs.back_to_broker(conn, cfg.queue, PROCESS_LIMIT))
    send([Message(j.id, j.queue, j.priority) for j in released])
    due = retry.in_transaction(db, lambda conn: procs.due_jobs(conn, cfg.queue, True, PROCESS_LIMIT))
    for job in due:
        if executor.should_die:
            break
        if deadline is not None and time.monotonic() >= deadline:
            report.timed_out = True
            break
        if job.state == JobState.BACK_TO_BROKER:
            continue  # published by back_to_broker above
        try:
            report.count(executor.process_job(job.id))
        except BgqError as exc:
            cfg.logger.critical(f"bgq: Unexpected error occurred. (ID: {job.id})", exc_info=exc)
            report.count("error")
    promoted = retry.in_transaction(db, procs.promote_waiting)
    send([Message(j.id, j.queue, j.priority) for j in promoted])
    report.promoted = len(promoted)
    if cfg.lost_message_timeout:
        timeout = cfg.lost_message_timeout
        lost = retry.in_transaction(
            db, lambda conn: procs.lost_messages(conn, cfg.queue, timeout, PROCESS_LIMIT)
        )
        for job in lost:
            cfg.logger.warning(f"bgq: Lost broker message republished (ID: {job.id}).")
        send([Message(j.id, j.queue, j.priority) for j in lost])
        report.republished = len(lost)
