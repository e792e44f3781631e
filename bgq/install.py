"""`bgq install-procs`: render db/<dialect>/*.sql for a table, install them, record version and checksum."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .db import Database
from .errors import SchemaVersionError
from .procs import ALL_PROCS, INTERNAL_PROCS, Procs

#: The procedure set this package expects; bump it when any procedure's behaviour changes.
SCHEMA_VERSION = "2"
_PLACEHOLDER = "{{ table }}"


def sql_dir(dialect: str) -> Path:
    """db/<dialect>/: inside the installed wheel (bgq/sql/) or, from a source tree, beside bgq/."""
    packaged = resources.files("bgq") / "sql" / dialect
    if packaged.is_dir():
        return Path(str(packaged))
    source = Path(__file__).resolve().parent.parent / "db" / dialect
    if source.is_dir():
        return source
    raise FileNotFoundError(f"bgq's SQL files for {dialect} are missing (looked in {packaged} and {source}).")


@dataclass(frozen=True)
class SqlFiles:
    schema: str
    routines: dict[str, str]  # name -> CREATE statement (still with the placeholder)
    checksum: str

    @classmethod
    def load(cls, dialect: str) -> SqlFiles:
        folder = sql_dir(dialect)
        names = [p.name for p in (*ALL_PROCS, *INTERNAL_PROCS)]
        schema = (folder / "schema.sql").read_text()
        routines = {name: (folder / f"{name}.sql").read_text() for name in names}
        digest = hashlib.sha256(schema.encode())
        for name in sorted(routines):
            digest.update(name.encode() + b"\0" + routines[name].encode())
        return cls(schema, routines, digest.hexdigest()[:16])


def render(text: str, table: str) -> str:
    return text.replace(_PLACEHOLDER, table)


def _statements(text: str) -> list[str]:
    """Split schema.sql on ';' at line ends, dropping comment-only chunks."""
    out = []
    for chunk in text.split(";\n"):
        code = [line for line in chunk.splitlines() if line.strip() and not line.strip().startswith("--")]
        if code:
            out.append(chunk.strip())
    return out


def install(db: Database, table: str) -> bool:
    """Create the tables and (re)install every procedure. Returns False when already up to date."""
    files = SqlFiles.load(db.dialect.name)
    procs = Procs(db, table)
    with db.transaction() as conn:
        procs.run(conn, _statements(render(files.schema, table)))
    with db.transaction() as conn:
        if procs.installed(conn) == {"version": SCHEMA_VERSION, "checksum": files.checksum}:
            return False
    functions = {p.name for p in (*ALL_PROCS, *INTERNAL_PROCS) if p.function}
    with db.transaction() as conn:
        for name, text in files.routines.items():
            procs.run(
                conn, [db.dialect.drop_sql(table, name, name in functions), render(text, table).strip()]
            )
        procs.record_install(conn, {"version": SCHEMA_VERSION, "checksum": files.checksum})
    return True


def check_installed(db: Database, table: str) -> None:
    """Raise SchemaVersionError unless this package's procedures are installed for `table`."""
    files = SqlFiles.load(db.dialect.name)
    try:
        with db.transaction() as conn:
            meta = Procs(db, table).installed(conn)
    except SchemaVersionError:  # the meta table does not exist
        meta = {}
    hint = f"run `bgq install-procs` (table {table!r}, database {db.safe_url})"
    if not meta:
        raise SchemaVersionError(f"bgq is not installed in this database: {hint}.")
    if meta.get("version") != SCHEMA_VERSION or meta.get("checksum") != files.checksum:
        raise SchemaVersionError(
            f"The installed bgq procedures are version {meta.get('version')} ({meta.get('checksum')}), "
            f"this package expects version {SCHEMA_VERSION} ({files.checksum}): {hint}."
        )


def uninstall(db: Database, table: str) -> None:
    """Drop bgq's procedures and tables for `table` (tests, and people leaving bgq)."""
    procs = Procs(db, table)
    with db.transaction() as conn:
        for proc in (*ALL_PROCS, *INTERNAL_PROCS):
            procs.run(conn, [db.dialect.drop_sql(table, proc.name, proc.function)])
        procs.run(conn, [f"DROP TABLE IF EXISTS {table}{suffix}" for suffix in ("_meta", "_group", "")])
        procs.run(conn, [db.dialect.drop_sql(table, "notify", True)])  # PostgreSQL's insert trigger
