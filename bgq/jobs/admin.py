"""Operations for people: requeue, run now, cancel, pause, workers, a job's row, monitor, clear-finished."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from ..config import QUEUE_NAME_RE, Config, read_clock
from ..errors import ConfigError, JobNotFoundError, PublishError
from ..model import Cancelled, JobRef, Message, Pause, WorkerRow
from ..sql import retry
from ..sql.database import Store
from .sender import Sender
from .validate import MAX_BIGINT, MAX_TEXT, check_text


def check_job_id(job_id: int) -> None:
    """Raise the procedures' JobNotFoundError for an id no job can have: the database would
    refuse one outside the BIGINT range as an error (MySQL: out of range) instead of finding nothing."""
    if isinstance(job_id, int) and not 1 <= job_id <= MAX_BIGINT:  # ids are BIGINTs from 1
        raise JobNotFoundError("bgq: no such job")


class Admin:
    """One queue's operations for people and tools (`bgq requeue`, `bgq monitor`, `bgq
    clear-finished`); each is one procedure call in a transaction of its own."""

    def __init__(self, config: Config, store: Store, sender: Sender) -> None:
        self.config = config
        self.store = store
        self.sender = sender
        self.log = config.logger

    def requeue(self, job_id: int, reason: str) -> JobRef:
        """The DBA's manual requeue: the job becomes READY again (not while PROCESSING)."""
        check_job_id(job_id)
        with self.store.database.transaction() as conn:
            job = self.store.procs.requeue(conn, job_id, reason)
        self.sender.send([Message(job.id, job.queue, job.priority)])
        return job

    def run_now(self, job_id: int, reason: str) -> JobRef:
        """Clear a READY or TEMPORARILY_FAILED job's postponement: it is due at once (broker
        mode: its id is sent again; the claim is exactly-once)."""
        check_job_id(job_id)
        with self.store.database.transaction() as conn:
            job = self.store.procs.run_now(conn, job_id, reason)
        self.sender.send([Message(job.id, job.queue, job.priority)])
        return job

    def workers(self) -> list[WorkerRow]:
        """The registered worker processes of the queue and its sub-queues (`bgq workers`), in id
        order; a row whose last_heartbeat_at is older than worker_dead_after is a dead worker the
        reaper has not removed yet."""
        with self.store.database.transaction() as conn:
            return self.store.procs.workers(conn, self.config.queue)

    def cancel(self, job_id: int, reason: str) -> Cancelled:
        """Queue.cancel (its docstring is the contract)."""
        check_job_id(job_id)
        with self.store.database.transaction() as conn:
            result = self.store.procs.cancel(conn, job_id, reason)
        if result.promoted_id is not None:
            self.sender.send_job(result.promoted_id)
        return result

    def pause(
        self, reason: str, *, group: str | None = None, queue: str | None = None, by: str | None = None
    ) -> bool:
        """Queue.pause (its docstring is the contract)."""
        kind, name = self._target(group, queue)
        with self.store.database.transaction() as conn:
            return self.store.procs.pause(conn, kind, name, reason, by)

    def resume(self, *, group: str | None = None, queue: str | None = None) -> bool:
        """Queue.resume (its docstring is the contract)."""
        kind, name = self._target(group, queue)
        with self.store.database.transaction() as conn:
            return self.store.procs.resume(conn, kind, name)

    def pauses(self) -> list[Pause]:
        """Every paused queue and group."""
        with self.store.database.transaction() as conn:
            return self.store.procs.pauses(conn)

    def _target(self, group: str | None, queue: str | None) -> tuple[str, str]:
        """("group", name) or ("queue", name), refusing a name no job could carry: a queue name
        a Queue could not be configured with, a group name publish would refuse."""
        if group is not None and queue is not None:
            raise ConfigError("Pause a queue or a group, not both at once.")
        if group is not None:
            try:
                check_text("serial_group", group)
            except PublishError as exc:
                raise ConfigError(f"Invalid serial group to pause or resume: {exc}") from exc
            return "group", group
        name = queue if queue is not None else self.config.queue
        if not isinstance(name, str) or not QUEUE_NAME_RE.fullmatch(name):
            raise ConfigError(
                f"Invalid queue to pause or resume: {name!r} (letters, digits, _ . -, up to 200)."
            )
        return "queue", name

    def get_job(self, job_id: int) -> dict[str, Any] | None:
        """The job's row, for people and tests."""
        with self.store.database.transaction() as conn:
            return self.store.procs.get_job(conn, job_id)

    #: A PROCESSING job started longer ago than this (s) is stuck for the monitor (24 hours).
    STUCK_RUN_S = 86400

    def get_unfinished_job_identifiers(
        self, identifiers: list[str] | tuple[str, ...] = (), exclude_processing: bool = False
    ) -> list[str]:
        """Queue.get_unfinished_job_identifiers (its docstring is the contract)."""
        if isinstance(identifiers, str | bytes):
            raise TypeError("identifiers must be a list of strings, not one string.")
        wanted = list(identifiers)
        if not all(isinstance(i, str) for i in wanted):
            raise TypeError("identifiers must be strings.")
        if wanted:
            wanted = [i for i in wanted if len(i) <= MAX_TEXT]  # longer ones cannot be stored
            if not wanted:
                return []
        with self.store.database.transaction() as conn:
            return self.store.procs.unfinished_identifiers(
                conn, self.config.queue, json.dumps(wanted) if wanted else None, exclude_processing
            )

    def report_stuck_jobs(self) -> dict[int, dict[str, Any]]:
        """The monitor (`bgq monitor`): jobs that need a person, per state.

        Returns {4: {"count": n, "oldest_since": datetime | None}, 5: {...}, 2: {...}}:
        TEMPORARILY_FAILED and PERMANENTLY_FAILED jobs with their oldest created_at, and PROCESSING
        jobs started (last_attempt_at) more than 24 hours ago with the oldest start. When any
        count is not 0 it logs one record, critical if there are permanent failures or long runs,
        else warning.
        """
        with self.store.database.transaction() as conn:
            rows = self.store.procs.monitor(conn, self.config.queue, self.STUCK_RUN_S)
        by_state = {r.state: r for r in rows}
        temporary, permanent, running = by_state[4], by_state[5], by_state[2]
        parts = []
        if temporary.job_count:
            parts.append(
                f"{temporary.job_count}x TEMPORARILY_FAILED (oldest {self._stamp(temporary.oldest_since)})"
            )
        if permanent.job_count:
            parts.append(
                f"{permanent.job_count}x PERMANENTLY_FAILED (oldest {self._stamp(permanent.oldest_since)})"
            )
        if running.job_count:
            parts.append(
                f"{running.job_count}x PROCESSING running longer than 24 hours "
                f"(since {self._stamp(running.oldest_since)})"
            )
        if parts:
            message = f"bgq: Stuck jobs report: {', '.join(parts)}."
            if permanent.job_count or running.job_count:
                self.log.critical(message)
            else:
                self.log.warning(message)
        return {s: {"count": r.job_count, "oldest_since": r.oldest_since} for s, r in by_state.items()}

    @staticmethod
    def _stamp(value: dt.datetime | None) -> str:
        """A monitor timestamp for people: UTC to the second."""
        return "-" if value is None else value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

    def clear_finished_jobs(self, days: int | None = None) -> int:
        """Delete this queue's FINISHED jobs (`bgq clear-finished`); returns how many.

        `days` None or 0: every finished job; otherwise those created before today 00:00 UTC
        minus `days` days. REDUNDANT and failed jobs stay.
        """
        if days is not None and (isinstance(days, bool) or not isinstance(days, int) or days < 0):
            raise ValueError(f"days must be a whole number >= 0 or None, got {days!r}.")
        before = None
        if days:
            today = read_clock(self.config.clock) if self.config.clock else dt.datetime.now(dt.UTC)
            midnight = today.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
            try:
                before = midnight - dt.timedelta(days=days)
            except OverflowError:  # before the year 1: no job was created that long ago
                return 0
        return retry.in_transaction(
            self.store.database, lambda conn: self.store.procs.clear_finished(conn, self.config.queue, before)
        )
