"""Operations for people: requeue, unfinished identifiers, the monitor, clear-finished (a Queue mixin)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from .procs import JobRef
from .validate import MAX_TEXT


class Operations:
    """Queue's operations side; Queue provides config, log, database, procs, _send and _retrying."""

    def requeue(self, job_id: int, reason: str) -> JobRef:
        """The DBA's manual requeue: the job becomes READY again (not while PROCESSING)."""
        with self.database.transaction() as conn:
            job = self.procs.requeue(conn, job_id, reason)
        self._send([(job.id, job.queue, job.priority, None)])
        return job

    def get_job(self, job_id: int) -> dict[str, Any] | None:
        """The job's row, for people and tests."""
        with self.database.transaction() as conn:
            return self.procs.get_job(conn, job_id)

    #: A PROCESSING job started longer ago than this (s) is stuck for the monitor (24 hours).
    STUCK_RUN_S = 86400

    def get_unfinished_job_identifiers(
        self, identifiers: list[str] | tuple[str, ...] = (), exclude_processing: bool = False
    ) -> list[str]:
        """The distinct identifiers of this queue's jobs that still have work ahead, sorted.

        A job is finished when FINISHED, REDUNDANT or PERMANENTLY_FAILED (and, with
        `exclude_processing`, PROCESSING: a running job does not count). `identifiers` limits the
        answer to those; empty means every job that has an identifier.
        """
        if isinstance(identifiers, str | bytes):
            raise TypeError("identifiers must be a list of strings, not one string.")
        wanted = list(identifiers)
        if not all(isinstance(i, str) for i in wanted):
            raise TypeError("identifiers must be strings.")
        if wanted:
            wanted = [i for i in wanted if len(i) <= MAX_TEXT]  # longer ones cannot be stored
            if not wanted:
                return []
        with self.database.transaction() as conn:
            return self.procs.unfinished_identifiers(
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
        with self.database.transaction() as conn:
            rows = self.procs.monitor(conn, self.config.queue, self.STUCK_RUN_S)
        report = {r.state: {"count": r.job_count, "oldest_since": r.oldest_since} for r in rows}
        temporary, permanent, running = report[4], report[5], report[2]
        parts = []
        if temporary["count"]:
            parts.append(
                f"{temporary['count']}x TEMPORARILY_FAILED (oldest {self._stamp(temporary['oldest_since'])})"
            )
        if permanent["count"]:
            parts.append(
                f"{permanent['count']}x PERMANENTLY_FAILED (oldest {self._stamp(permanent['oldest_since'])})"
            )
        if running["count"]:
            parts.append(
                f"{running['count']}x PROCESSING running longer than 24 hours "
                f"(since {self._stamp(running['oldest_since'])})"
            )
        if parts:
            message = f"bgq: Stuck jobs report: {', '.join(parts)}."
            if permanent["count"] or running["count"]:
                self.log.critical(message)
            else:
                self.log.warning(message)
        return report

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
            midnight = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
            before = midnight - dt.timedelta(days=days)
        return self._retrying(lambda conn: self.procs.clear_finished(conn, self.config.queue, before))
