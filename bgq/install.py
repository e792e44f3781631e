"""`bgq install-procs`: render db/<dialect>/*.sql for a table, install them, record version and checksums."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jinja2

from .db import Database, InstalledRoutine
from .errors import SchemaVersionError
from .procs import ALL_PROCS, INTERNAL_PROCS, Procs

#: The procedure set this package expects; bump it when any procedure's behaviour changes.
SCHEMA_VERSION = "2"
#: The shared SQL rules every procedure file may use (Jinja macros: in_queue, due, ...).
_RULES = "macros/rules.sql"
#: {table}_meta rows "routine:<name>" hold each installed routine's fingerprint.
_ROUTINE_KEY = "routine:"


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
        digest.update((folder / _RULES).read_bytes())
        for name in sorted(routines):
            digest.update(name.encode() + b"\0" + routines[name].encode())
        return cls(schema, routines, digest.hexdigest()[:16])


def render(text: str, table: str, dialect: str) -> str:
    """A SQL file as it is installed: rendered by Jinja with `table` and the dialect's shared
    rules (db/<dialect>/macros/rules.sql), so a rule such as "due" is written once per dialect."""
    return _environment(dialect).from_string(text).render(table=table)


@functools.cache
def _environment(dialect: str) -> jinja2.Environment:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    rules = env.from_string((sql_dir(dialect) / _RULES).read_text()).module
    env.globals.update({name: macro for name, macro in vars(rules).items() if not name.startswith("_")})
    return env


def _statements(text: str) -> list[str]:
    """Split schema.sql on ';' at line ends, dropping comment-only chunks."""
    out = []
    for chunk in text.split(";\n"):
        code = [line for line in chunk.splitlines() if line.strip() and not line.strip().startswith("--")]
        if code:
            out.append(chunk.strip())
    return out


def fingerprint(found: list[InstalledRoutine]) -> str:
    """A routine's fingerprint: its parameters and its definition as the server's catalogue shows
    them (a hand-made change to either, or a second overload, changes it)."""
    text = "\n".join(sorted(f"{r.signature}\n{r.definition_digest}" for r in found))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class RoutineCheck:
    """How the installed routines compare with the expected set and the recorded fingerprints."""

    missing: tuple[str, ...]
    changed: tuple[str, ...]  # differs from what install-procs recorded (or has overloads)
    unrecorded: tuple[str, ...]  # present, but installed before fingerprints were recorded

    def broken(self) -> tuple[str, ...]:
        return self.missing + self.changed


def check_routines(meta: dict[str, str], found: dict[str, list[InstalledRoutine]]) -> RoutineCheck:
    missing, changed, unrecorded = [], [], []
    for proc in (*ALL_PROCS, *INTERNAL_PROCS):
        routines = found.get(proc.name)
        recorded = meta.get(_ROUTINE_KEY + proc.name)
        if not routines:
            missing.append(proc.name)
        elif len(routines) > 1:
            changed.append(proc.name)
        elif recorded is None:
            unrecorded.append(proc.name)
        elif routines[0].definition_digest is not None and recorded != fingerprint(routines):
            changed.append(proc.name)  # (a definition this user may not read is not compared)
    return RoutineCheck(tuple(missing), tuple(changed), tuple(unrecorded))


def install(db: Database, table: str) -> bool:
    """Create the tables and install the procedures: every one when the recorded version or
    checksum differs from the package's, else those missing, changed by hand or not yet
    fingerprinted (a partial install is repaired). Returns False when already up to date."""
    files = SqlFiles.load(db.dialect.name)
    procs = Procs(db, table)
    with db.transaction() as conn:
        procs.run(conn, _statements(render(files.schema, table, db.dialect.name)))
    with db.transaction() as conn:
        meta = procs.installed(conn)
        current = meta.get("version") == SCHEMA_VERSION and meta.get("checksum") == files.checksum
        check = check_routines(meta, procs.routines(conn))
    if current:
        names = set(check.broken() + check.unrecorded)
        if not names:
            return False
    else:
        names = set(files.routines)
    functions = {p.name for p in (*ALL_PROCS, *INTERNAL_PROCS) if p.function}
    with db.transaction() as conn:
        for name, text in files.routines.items():  # in install order: callees first
            if name in names:
                create = render(text, table, db.dialect.name).strip()
                procs.run(conn, [db.dialect.drop_sql(table, name, name in functions), create])
        found = procs.routines(conn)
        values = {"version": SCHEMA_VERSION, "checksum": files.checksum}
        values.update({_ROUTINE_KEY + name: fingerprint(found[name]) for name in files.routines})
        procs.record_install(conn, values)
    return True


def check_installed(db: Database, table: str) -> None:
    """Raise SchemaVersionError unless this package's procedures are installed for `table`: the
    recorded version and checksum, and every routine present as install-procs left it."""
    files = SqlFiles.load(db.dialect.name)
    try:
        with db.transaction() as conn:
            procs = Procs(db, table)
            meta = procs.installed(conn)
            found = procs.routines(conn) if meta else {}
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
    check = check_routines(meta, found)
    if check.broken():
        parts = []
        if check.missing:
            parts.append("missing " + ", ".join(f"{table}_{n}" for n in check.missing))
        if check.changed:
            parts.append("changed since install " + ", ".join(f"{table}_{n}" for n in check.changed))
        raise SchemaVersionError(f"The installed bgq procedures are incomplete ({'; '.join(parts)}): {hint}.")


def uninstall(db: Database, table: str) -> None:
    """Drop bgq's procedures and tables for `table` (tests, and people leaving bgq)."""
    procs = Procs(db, table)
    with db.transaction() as conn:
        for proc in (*ALL_PROCS, *INTERNAL_PROCS):
            procs.run(conn, [db.dialect.drop_sql(table, proc.name, proc.function)])
        procs.run(conn, [f"DROP TABLE IF EXISTS {table}{suffix}" for suffix in ("_meta", "_group", "")])
        procs.run(conn, [db.dialect.drop_sql(table, "notify", True)])  # PostgreSQL's insert trigger
