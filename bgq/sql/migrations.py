"""Schema migrations: db/<dialect>/migrations/NNNN_*.sql, their record in <table>_meta, the install lock."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..db import Database
from ..errors import ConnectionLostError, DatabaseError, LockTimeoutError
from .calls import Procs

#: {table}_meta has one row "migration:<NNNN_slug>" per applied migration; its value says how it
#: got there ("applied <UTC time>", "with schema.sql <UTC time>", "inferred from version <v>").
MIGRATION_KEY = "migration:"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_META_NAME_MAX = 64  # {table}_meta.name is VARCHAR(64)

#: How many migrations a table has that bgq installed before migrations existed:
#: it has no migration row, so its level is read from its recorded procedure version (the schema
#: and the procedures were versioned together then). Version "1" is the first released schema
#: (before `bgq work`); version "2" is that schema plus what `bgq work` needed. A table with no
#: version either (an install cut short before its record) counts as level 0. A level read this
#: way may be wrong for a table changed by hand (the ALTER the version 2 README asked for, without
#: `install-procs` afterwards): that is safe, because every step of every migration first checks
#: the catalogue (MySQL) or uses IF NOT EXISTS / CREATE OR REPLACE (PostgreSQL) and skips what is
#: there already.
LEGACY_LEVELS: dict[str, int] = {"1": 0, "2": 1}

#: How long `install-procs` waits for another one on the same table before giving up.
LOCK_WAIT = 600.0
#: The lease of the MySQL install lock row: a killed install delays the next one this long at most.
LOCK_LEASE = 60


@dataclass(frozen=True)
class Migration:
    """One file db/<dialect>/migrations/NNNN_<slug>.sql (text still with the placeholder)."""

    number: int
    name: str  # "0001_bgq_work"
    text: str

    @property
    def key(self) -> str:
        return MIGRATION_KEY + self.name

    def helper(self, table: str) -> str:
        """The MySQL helper procedure the file creates: {table}_migration_NNNN."""
        return f"{table}_migration_{self.number:04d}"


def load(folder: Path) -> tuple[Migration, ...]:
    """The migrations in `folder`, in order; numbered 0001, 0002, ... without gaps or repeats
    (two branches that both added 0003 must not both ship)."""
    if not folder.is_dir():
        raise FileNotFoundError(f"bgq's migrations are missing ({folder}).")
    found = []
    for path in sorted(folder.glob("*.sql")):
        match = _FILE.match(path.name)
        if match is None:
            raise ValueError(f"{path}: a migration is named NNNN_<slug>.sql (lower case).")
        found.append(Migration(int(match.group(1)), path.stem, path.read_text()))
    numbers = [m.number for m in found]
    if numbers != list(range(1, len(found) + 1)):
        raise ValueError(f"{folder}: migrations must be numbered 1..{len(found)} once each, found {numbers}.")
    for m in found:
        if len(m.key) > _META_NAME_MAX:
            raise ValueError(f"{folder}: {m.key!r} is over {_META_NAME_MAX} characters; shorten the slug.")
    return tuple(found)


def recorded(meta: dict[str, str]) -> set[str]:
    """The names of the migrations {table}_meta records as applied."""
    return {name[len(MIGRATION_KEY) :] for name in meta if name.startswith(MIGRATION_KEY)}


def pending(migrations: tuple[Migration, ...], meta: dict[str, str]) -> list[Migration]:
    done = recorded(meta)
    return [m for m in migrations if m.name not in done]


def unknown(migrations: tuple[Migration, ...], meta: dict[str, str]) -> list[str]:
    """Recorded migrations this package does not have (a newer bgq ran them)."""
    return sorted(recorded(meta) - {m.name for m in migrations})


def legacy_level(meta: dict[str, str]) -> int:
    """The level of a table without migration rows, from its recorded version (LEGACY_LEVELS)."""
    return LEGACY_LEVELS.get(meta.get("version", ""), 0)


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def table_exists(db: Database, conn: Connection, table: str) -> bool:
    """Whether the jobs table exists in the current database (MySQL) / schema (PostgreSQL)."""
    return bool(db.scalar(conn, db.dialect.table_exists_sql(), (table,)))


@contextmanager
def install_lock(
    db: Database, table: str, wait: float = LOCK_WAIT, lease: int = LOCK_LEASE
) -> Iterator[None]:
    """Only one `install-procs` at a time per table and database.

    PostgreSQL: the whole install runs in one transaction (its DDL is transactional), every step
    a savepoint of it (Database.one_transaction), and the lock is pg_advisory_xact_lock's: the
    COMMIT or ROLLBACK ends it, so no session ever keeps it, a pooled one (PgBouncer) included.

    MySQL/MariaDB (whose DDL commits implicitly, so no transaction can span a migration): the
    lock lives on a connection of its own, in autocommit mode (never idle inside a transaction,
    which the server would cut after `lock_timeout`), and is released at the end; if the release
    fails, the connection is invalidated. It is a lock row in `bgq_install_lock`, which
    holds across a Galera cluster as GET_LOCK would not (bgq/db/mysql.py install_lock_sql); a
    thread refreshes its lease of `lease` seconds every lease / 6 while the install runs, so a
    killed install delays the next one by `lease` seconds at most. Raises LockTimeoutError after
    `wait` seconds."""
    sql = db.dialect.install_lock_sql()
    params = {"table": table, "holder": f"{socket.gethostname()[:150]} pid {os.getpid()} {uuid.uuid4().hex}",
              "lease": int(lease)}  # fmt: skip
    if sql.in_transaction:
        with db.one_transaction() as conn:
            _wait_for_lock(db, conn, sql.take, params, table, wait)
            yield
        return
    try:
        conn = db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    except sa.exc.DBAPIError as exc:
        raise db.translate(exc) from exc
    try:
        for statement in sql.setup:
            _scalar(db, conn, statement, params)
        _wait_for_lock(db, conn, sql.take, params, table, wait)
        done = threading.Event()
        keeper = None
        if sql.refresh:
            keeper = threading.Thread(
                target=_keep_lease, args=(db, conn, sql.refresh, params, lease / 6, done),
                name="bgq-install-lease", daemon=True,
            )  # fmt: skip
            keeper.start()
        try:
            yield
        finally:
            done.set()
            if keeper is not None:
                keeper.join(timeout=30)
            try:
                _scalar(db, conn, sql.release, params)
            except Exception:
                conn.invalidate()
                raise
    finally:
        conn.close()


def _wait_for_lock(
    db: Database, conn: Connection, take: Sequence[str], params: dict[str, object], table: str, wait: float
) -> None:
    """Take the install lock (`_take`), polling every 0.2 s; LockTimeoutError after `wait` s."""
    deadline, warned = time.monotonic() + wait, False
    while not _take(db, conn, take, params):
        if time.monotonic() >= deadline:
            raise LockTimeoutError(
                f"Another `bgq install-procs` is running on table {table!r} ({db.safe_url}): "
                f"waited {wait:g} s for it."
            )
        if not warned:
            db.log.warning(f"bgq: another install-procs is running on table {table!r}; waiting for it.")
            warned = True
        time.sleep(0.2)


def _take(db: Database, conn: Connection, take: Sequence[str], params: dict[str, object]) -> bool:
    """Run `take`'s statements; true when the last one says the lock is ours. A deadlock or a
    failed certification (two Galera nodes writing the lock row at once) is a lock not taken yet."""
    try:
        result = None
        for statement in take:
            result = _scalar(db, conn, statement, params)
        return bool(result)
    except DatabaseError as exc:
        if exc.retryable and not isinstance(exc, ConnectionLostError):
            return False
        raise


def _keep_lease(
    db: Database,
    conn: Connection,
    refresh: str,
    params: dict[str, object],
    every: float,
    done: threading.Event,
) -> None:
    """Refresh the lock row's lease every `every` seconds until `done` (a failed refresh is
    logged and tried again at the next turn: the lease is six turns long)."""
    while not done.wait(every):
        try:
            _scalar(db, conn, refresh, params)
        except Exception as exc:  # noqa: BLE001 (the install goes on; the next turn tries again)
            db.log.warning(f"bgq: could not refresh the install lock's lease ({exc}).")


def _scalar(db: Database, conn: Connection, sql: str, params: dict[str, object]) -> object:
    rows = db.tuples(conn, sql, params)
    return rows[0][0] if rows else None


def record(procs: Procs, conn: Connection, migrations: Sequence[Migration], value: str) -> None:
    """Record `migrations` as applied in {table}_meta (in the caller's transaction)."""
    procs.add_meta(conn, {m.key: value for m in migrations})
