"""Schema migrations: db/<dialect>/migrations/NNNN_*.sql, their record in <table>_meta, the install lock."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .db import Database
from .errors import LockTimeoutError

#: {table}_meta has one row "migration:<NNNN_slug>" per applied migration; its value says how it
#: got there ("applied <UTC time>", "with schema.sql <UTC time>", "inferred from version <v>").
MIGRATION_KEY = "migration:"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_META_NAME_MAX = 64  # {table}_meta.name is VARCHAR(64)

#: How many of a dialect's migrations a table has that bgq installed before migrations existed:
#: it has no migration row, so its level is read from its recorded procedure version (the schema
#: and the procedures were versioned together then). Version "1" is the first released schema
#: (before `bgq work`); version "2" is that schema plus what `bgq work` needed. A table with no
#: version either (an install cut short before its record) counts as level 0. A level read this
#: way may be wrong for a table changed by hand (the ALTER the version 2 README asked for, without
#: `install-procs` afterwards): that is safe, because every step of every migration first checks
#: the catalogue (MySQL) or uses IF NOT EXISTS / CREATE OR REPLACE (PostgreSQL) and skips what is
#: there already.
LEGACY_LEVELS: dict[str, dict[str, int]] = {
    "mysql": {"1": 0, "2": 1},
    "postgres": {"1": 0, "2": 2},
}

#: How long `install-procs` waits for another one on the same table before giving up.
LOCK_WAIT = 600.0


@dataclass(frozen=True)
class Migration:
    """One file db/<dialect>/migrations/NNNN_<slug>.sql (text still with the placeholder)."""

    number: int
    name: str  # "0001_ungrouped_priority"
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


def legacy_level(dialect: str, meta: dict[str, str]) -> int:
    """The level of a table without migration rows, from its recorded version (LEGACY_LEVELS)."""
    return LEGACY_LEVELS[dialect].get(meta.get("version", ""), 0)


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def table_exists(db: Database, conn: Connection, table: str) -> bool:
    """Whether the jobs table exists in the current database (MySQL) / schema (PostgreSQL)."""
    if db.dialect.name == "mysql":
        where = "information_schema.tables WHERE table_schema = DATABASE() AND table_name = %s"
    else:
        where = "pg_catalog.pg_tables WHERE schemaname = current_schema() AND tablename = %s"
    sql = f"SELECT COUNT(*) FROM {where}"
    return bool(conn.exec_driver_sql(sql, (table,)).scalar_one())


def _lock_sql(dialect: str) -> tuple[str, str]:
    """(try to take the lock without waiting, release it), both with one %s: the table name.

    MySQL: GET_LOCK is server-wide, so the name carries the database; names are at most 64
    characters, hence the hash. PostgreSQL: an advisory lock is per database; the pair of int4
    keys is (a constant for "bgq install", the table's hash). A hash collision only makes two
    installs wait for each other."""
    if dialect == "mysql":
        name = "CONCAT('bgq_install_', LEFT(SHA2(CONCAT(DATABASE(), '.', %s), 256), 40))"
        return f"SELECT GET_LOCK({name}, 0)", f"SELECT RELEASE_LOCK({name})"
    keys = "hashtext('bgq install'), hashtext(%s)"
    return f"SELECT pg_try_advisory_lock({keys})", f"SELECT pg_advisory_unlock({keys})"


@contextmanager
def install_lock(db: Database, table: str, wait: float = LOCK_WAIT) -> Iterator[None]:
    """Only one `install-procs` at a time per table and database.

    The lock is a session lock (MySQL DDL commits implicitly, so no transaction can span a
    migration): it lives on a connection of its own, in autocommit mode (never idle inside a
    transaction, which the server would cut after `lock_timeout`), and is released at the end.
    If the release fails, the connection is invalidated: closing the session frees the lock, so
    a pooled connection can never keep it. Raises LockTimeoutError after `wait` seconds."""
    take, release = _lock_sql(db.dialect.name)
    try:
        conn = db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    except sa.exc.DBAPIError as exc:
        raise db.translate(exc) from exc
    try:
        deadline, warned = time.monotonic() + wait, False
        while not _scalar(db, conn, take, table):
            if time.monotonic() >= deadline:
                raise LockTimeoutError(
                    f"Another `bgq install-procs` is running on table {table!r} ({db.safe_url}): "
                    f"waited {wait:g} s for it."
                )
            if not warned:
                db.log.warning(f"bgq: another install-procs is running on table {table!r}; waiting for it.")
                warned = True
            time.sleep(0.2)
        try:
            yield
        finally:
            try:
                _scalar(db, conn, release, table)
            except Exception:
                conn.invalidate()
                raise
    finally:
        conn.close()


def _scalar(db: Database, conn: Connection, sql: str, table: str) -> object:
    try:
        return conn.exec_driver_sql(sql, (table,)).scalar()
    except sa.exc.DBAPIError as exc:
        raise db.translate(exc) from exc


def record(conn: Connection, table: str, migrations: Sequence[Migration], value: str) -> None:
    """Record `migrations` as applied in {table}_meta (in the caller's transaction)."""
    for m in migrations:
        conn.exec_driver_sql(f"INSERT INTO {table}_meta (name, value) VALUES (%s, %s)", (m.key, value))
