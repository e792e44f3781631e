"""The web console's reads (`bgq web`): counts, keyset pages of jobs and serial groups, on indexes.

The second module (after bgq/sql/calls.py) that names SQL, and only SELECTs: state changes stay in
the stored procedures. Each runs through the call seam (bgq/db: Database.rows), which translates
driver errors. Every list is a keyset page (`WHERE id < :after ORDER BY id DESC LIMIT n`),
so page 10,000 costs what page 1 costs; each filter runs on an index the schema creates:

  state        {table}_state (state, id)
  identifier   {table}_identifier (identifier; InnoDB appends id, PostgreSQL filters by it)
  group        {table}_group_id (serial_group, id)  (migration 0005_console)
  queue, callback, error text: the primary key walked in id order, filtering as it goes (no
               index narrows them: a filter that matches few rows of a huge table reads far;
               combine it with a state).
The overview reads {table}_queue_state (counts, index-only) and {table}_state_updated (the last
hour, one range per state); EXPLAIN output: `tools/web_timing.py --explain`.
The serial-groups page walks {table}_pending_head in group order and stops after one page.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection

from ..db import Database
from ..model import JobState

#: The columns a list of jobs shows (the error cut to its first 200 characters).
_LIST_COLUMNS = (
    "id, queue, priority, callback_name, state, serial_group, identifier, created_at, last_attempt_at,"
    " number_of_attempts, postponed_by, LEFT(error_message, 200) AS error_message"
)
#: Claimable states (a group's pending jobs); the same list as the pending_head index.
PENDING = (-1, 1, 4, 6, 8)


@dataclass(frozen=True)
class JobFilter:
    """What the jobs and failures pages filter on; None: any."""

    states: tuple[int, ...] = ()
    queue: str | None = None
    callback: str | None = None
    group: str | None = None
    identifier: str | None = None
    error: str | None = None  # a piece of the error text, case-insensitive

    def query(self) -> dict[str, str]:
        """The filter as URL query parameters (for links to the next page and to actions)."""
        out = {"state": ",".join(str(s) for s in self.states)} if self.states else {}
        for name in ("queue", "callback", "group", "identifier", "error"):
            value = getattr(self, name)
            if value:
                out[name] = value
        return out


@dataclass
class GroupView:
    """One serial group with work ahead: its head, what blocks it, its backlog."""

    name: str
    pending: int  # jobs not started yet (states -1, 1, 4, 6, 8)
    oldest_id: int
    oldest_created_at: dt.datetime | None = None
    head: dict[str, Any] | None = None  # the first pending job by (priority, id)
    running: dict[str, Any] | None = None  # the group's PROCESSING job
    extra: dict[str, Any] = field(default_factory=dict)


class Reads:
    """The console's SELECTs on one table; each runs in the transaction of the connection given."""

    def __init__(self, db: Database, table: str) -> None:
        self.db = db
        self.table = table
        self.postgres = db.dialect.name == "postgres"

    def _rows(self, conn: Connection, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        return self.db.rows(conn, sql, params)

    # --- overview ---

    def counts(self, conn: Connection) -> list[dict[str, Any]]:
        """Jobs per (queue, state)."""
        return self._rows(
            conn,
            f"SELECT queue, state, COUNT(*) AS n FROM {self.table}"
            " GROUP BY queue, state ORDER BY queue, state",
        )

    def signature(self, conn: Connection) -> tuple[Any, ...]:
        """A cheap fingerprint of the table that changes with every insert and state change: the
        newest id and each state's latest updated_at, one index dive each (the primary key, then
        {table}_state_updated per state). The live refresh polls it."""
        (row,) = self.db.tuples(
            conn,
            f"SELECT (SELECT MAX(id) FROM {self.table}), "
            + ", ".join(
                f"(SELECT MAX(updated_at) FROM {self.table} WHERE state = {int(state)})" for state in JobState
            ),
        )
        return row

    def oldest_due(self, conn: Connection, now: dt.datetime) -> dict[str, Any] | None:
        """The longest-waiting READY or TEMPORARILY_FAILED job whose postponement is over."""
        if self.postgres:
            wait = "CEIL(COALESCE(postponed_by, 0) / 1000.0) * INTERVAL '1 second'"
        else:
            wait = "INTERVAL CEIL(COALESCE(postponed_by, 0) / 1000) SECOND"
        rows = self._rows(
            conn,
            f"SELECT id, queue, callback_name, state, created_at FROM {self.table}"
            f" WHERE state IN (1, 4) AND (processed_by_broker = 1"
            f" OR GREATEST(created_at, COALESCE(last_attempt_at, created_at)) + {wait} <= %s)"
            " ORDER BY id LIMIT 1",
            (now,),
        )
        return rows[0] if rows else None

    def last_hour(self, conn: Connection, now: dt.datetime) -> list[dict[str, Any]]:
        """Per minute of the last hour (0 = the oldest): jobs finished and jobs failed, by the
        time of their last change (a job counts once, in its current state)."""
        since = now - dt.timedelta(hours=1)
        if self.postgres:
            minute = "FLOOR(EXTRACT(EPOCH FROM (updated_at - %s)) / 60)"
        else:
            minute = "TIMESTAMPDIFF(MINUTE, %s, updated_at)"
        return self._rows(
            conn,
            f"SELECT {minute} AS minute,"
            " SUM(CASE WHEN state = 3 THEN 1 ELSE 0 END) AS finished,"
            " SUM(CASE WHEN state IN (4, 5) THEN 1 ELSE 0 END) AS failed"
            f" FROM {self.table} WHERE state IN (3, 4, 5) AND updated_at >= %s AND updated_at <= %s"
            " GROUP BY 1 ORDER BY 1",
            (since, since, now),
        )

    # --- jobs ---

    def _where(self, f: JobFilter) -> tuple[list[str], list[Any]]:
        where: list[str] = []
        params: list[Any] = []
        if f.states:
            where.append(f"state IN ({', '.join(['%s'] * len(f.states))})")
            params.extend(f.states)
        for column, value in (
            ("queue", f.queue),
            ("callback_name", f.callback),
            ("serial_group", f.group),
            ("identifier", f.identifier),
        ):
            if value:
                where.append(f"{column} = %s")
                params.append(value)
        if f.error:
            pattern = "%" + f.error.replace("!", "!!").replace("%", "!%").replace("_", "!_") + "%"
            where.append(
                ("error_message ILIKE %s" if self.postgres else "error_message LIKE %s") + " ESCAPE '!'"
            )
            params.append(pattern)
        return where, params

    def jobs(
        self, conn: Connection, f: JobFilter, after: int | None, newest_first: bool, limit: int
    ) -> list[dict[str, Any]]:
        """One keyset page of jobs matching `f`: ids below (or above) `after`, in id order."""
        where, params = self._where(f)
        if after is not None:
            where.append("id < %s" if newest_first else "id > %s")
            params.append(after)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        order = "DESC" if newest_first else "ASC"
        return self._rows(
            conn,
            f"SELECT {_LIST_COLUMNS} FROM {self.table}{clause} ORDER BY id {order} LIMIT %s",
            (*params, limit),
        )

    def job(self, conn: Connection, job_id: int) -> dict[str, Any] | None:
        rows = self._rows(conn, f"SELECT * FROM {self.table} WHERE id = %s", (job_id,))
        return rows[0] if rows else None

    def count(self, conn: Connection, f: JobFilter) -> int:
        """How many jobs match `f` (the confirmation of a bulk action says it)."""
        where, params = self._where(f)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        return int(self.db.scalar(conn, f"SELECT COUNT(*) FROM {self.table}{clause}", params))

    # --- serial groups ---

    def groups(self, conn: Connection, after: str | None, name: str | None, limit: int) -> list[GroupView]:
        """One page of the serial groups that have jobs not started yet, in name order (after
        `after`; only `name` when given): each with its backlog, its head and its running job."""
        if self.postgres:  # the partial index's own predicate
            column = "serial_group"
            where = f"serial_group IS NOT NULL AND state IN ({', '.join(str(s) for s in PENDING)})"
        else:  # the generated column of the pending_head index: the group while pending, else NULL
            column = "pending_group"
            where = "pending_group IS NOT NULL"
        params: list[Any] = []
        if name:
            where += f" AND {column} = %s"
            params.append(name)
        if after is not None:
            where += f" AND {column} > %s"
            params.append(after)
        found = self._rows(
            conn,
            f"SELECT {column} AS name, COUNT(*) AS pending, MIN(id) AS oldest_id FROM {self.table}"
            f" WHERE {where} GROUP BY {column} ORDER BY {column} LIMIT %s",
            (*params, limit),
        )
        views = [GroupView(r["name"], int(r["pending"]), int(r["oldest_id"])) for r in found]
        if not views:
            return views
        names = tuple(v.name for v in views)
        marks = ", ".join(["%s"] * len(names))
        oldest = {
            r["id"]: r["created_at"]
            for r in self._rows(
                conn,
                f"SELECT id, created_at FROM {self.table} WHERE id IN ({marks})",
                tuple(v.oldest_id for v in views),
            )
        }
        running = {
            r["serial_group"]: r
            for r in self._rows(
                conn,
                f"SELECT id, serial_group, callback_name, last_attempt_at, updated_at, pid FROM {self.table}"
                f" WHERE state = 2 AND {'serial_group' if self.postgres else 'running_group'} IN ({marks})",
                names,
            )
        }
        for view in views:
            view.oldest_created_at = oldest.get(view.oldest_id)
            view.running = running.get(view.name)
            view.head = self._head(conn, view.name)
        return views

    def _head(self, conn: Connection, group: str) -> dict[str, Any] | None:
        """A group's first pending job by (priority, id): one dive into the pending_head index."""
        pending = ", ".join(str(s) for s in PENDING)
        where = f"serial_group = %s AND state IN ({pending})" if self.postgres else "pending_group = %s"
        rows = self._rows(
            conn,
            f"SELECT id, queue, state, priority, callback_name, created_at, last_attempt_at, postponed_by,"
            f" processed_by_broker, LEFT(error_message, 200) AS error_message FROM {self.table}"
            f" WHERE {where} ORDER BY priority, id LIMIT 1",
            (group,),
        )
        return rows[0] if rows else None
