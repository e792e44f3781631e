"""What a dialect module provides (the Protocol) and the records it exchanges with the rest of bgq."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.engine import Connection

from ..errors import BgqError


@dataclass(frozen=True)
class InstalledRoutine:
    """A routine as the server's catalogue shows it (install-procs' check of what is installed)."""

    name: str  # lower case, with the table prefix
    inputs: tuple[str, ...]  # the IN parameters' names, in order
    signature: str  # every parameter with its mode and type, as the catalogue prints them
    definition_digest: str | None  # MD5 of the catalogue's definition; None when it is not readable


@dataclass(frozen=True)
class InstallLockSql:
    """The statements of the install lock (bgq/sql/migrations.py install_lock), each run in autocommit
    mode with the parameters %(table)s (the jobs table), %(holder)s (this install's own token)
    and %(lease)s (seconds): `setup` once, then `take` until its last statement returns true,
    `refresh` (if any) every lease / 6 while the install runs, `release` at the end.
    `in_transaction`: the lock belongs to a transaction instead (PostgreSQL: the whole install
    runs in one, Database.one_transaction, and its COMMIT or ROLLBACK ends the lock, so no
    session keeps it, a pooled one included): `take` runs inside it and nothing is released."""

    setup: tuple[str, ...]
    take: tuple[str, ...]
    release: str
    refresh: str | None = None
    in_transaction: bool = False


@dataclass(frozen=True)
class Proc:
    """A stored procedure's signature: its file name, kind and typed parameters."""

    name: str
    params: tuple[tuple[str, str], ...]  # (parameter name, PostgreSQL type)
    function: bool = False  # a scalar function (SELECT f(...)), not a row-returning call


class Dialect(Protocol):
    """What differs between MySQL/MariaDB and PostgreSQL, and nothing else."""

    name: str
    #: Whether `send` and `read` work with this driver.
    can_send: bool

    def call_sql(self, table: str, proc: Proc) -> str:
        """The statement that calls `proc` with positional %s placeholders."""

    def now_sql(self) -> str:
        """The server's current UTC time with sub-second precision."""

    def drop_sql(self, table: str, name: str, function: bool) -> str:
        """Drop an installed procedure or function if it exists."""

    def routines(self, conn: Connection, names: Sequence[str]) -> list[InstalledRoutine]:
        """The routines of the current database / schema among `names` (lower case); a name
        with overloads (PostgreSQL) appears once per overload."""

    def translate(self, exc: BaseException) -> BgqError | None:
        """Map a driver exception to bgq's by its error code (never its text): the procedures'
        coded errors, and the server's (lock timeout, deadlock, lost connection, ...) as the
        DatabaseError subclass whose `retryable` says whether a retry may cure it; None when the
        code is not one bgq names."""

    def session_sql(self, dbapi_connection: Any, seconds: int) -> list[str]:
        """Statements run on each new connection of bgq's engine: lock waits end after `seconds`,
        and the server cuts a session left idle inside a transaction for `seconds`."""

    def transaction_sql(self, seconds: int) -> str:
        """One statement that sets session_sql's bounds for the current transaction only
        (PostgreSQL's pooled mode, bgq/db/__init__.py)."""

    def causal_sync(self, dbapi_connection: Any) -> str | None:
        """On a cluster whose nodes apply each other's commits after they return (Galera), set up
        a new connection so that the returned statement, run first in each transaction, waits
        until this node has applied every commit the cluster certified before it; None where
        every read already sees every commit (one server, a PostgreSQL primary)."""

    def table_exists_sql(self) -> str:
        """A COUNT of the tables named %s in the current database (MySQL) or schema (PostgreSQL)."""

    def keep_autocommit(self, dbapi_connection: Any) -> int:
        """Switch a connection bgq keeps for single statements (bgq/db/autocommit.py) to autocommit;
        return the file descriptor of its socket."""

    def send(self, dbapi_connection: Any, sql: str, values: Sequence[Any]) -> None:
        """Send one statement (%s placeholders) on a kept autocommit connection without waiting
        for its outcome, which `read` waits for; the server runs and commits it meanwhile."""

    def read(self, dbapi_connection: Any) -> list[tuple[Any, ...]]:
        """The rows of the statement `send` sent, once the server has run it (PostgreSQL: each
        value as the server's text, in bytes); its error raised as the driver's exception."""

    def idle_outside_transaction(self, dbapi_connection: Any) -> bool:
        """Whether a kept autocommit connection is open and outside any transaction (anything
        else, after an error, means it is broken)."""

    def install_lock_sql(self) -> InstallLockSql:
        """The install lock of one table, taken without waiting, so that two
        `bgq install-procs` on one table never interleave (InstallLockSql)."""
