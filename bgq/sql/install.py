"""`bgq install-procs`: create or migrate the tables, install db/<dialect>/*.sql, record what it did."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection

from ..db import Database, InstalledRoutine
from ..errors import SchemaVersionError
from . import migrations
from .calls import ALL_PROCS, INTERNAL_PROCS, Procs
from .migrations import MIGRATION_KEY, Migration

if TYPE_CHECKING:
    import jinja2

#: The procedure set this package expects; bump it when any procedure's behaviour changes. (The
#: tables' shape is versioned by the migrations in db/<dialect>/migrations/, bgq/sql/migrations.py.)
SCHEMA_VERSION = "8"
#: The shared SQL rules every procedure file may use (Jinja macros: in_queue, due, ...).
_RULES = "macros/rules.sql"
#: {table}_meta rows "routine:<name>" hold each installed routine's fingerprint.
_ROUTINE_KEY = "routine:"


def sql_dir(dialect: str) -> Path:
    """db/<dialect>/: in an installed wheel beside this module (bgq/sql/<dialect>/), or, from a
    source tree, beside bgq/."""
    packaged = resources.files("bgq.sql") / dialect
    if packaged.is_dir():
        return Path(str(packaged))
    source = Path(__file__).resolve().parents[2] / "db" / dialect
    if source.is_dir():
        return source
    raise FileNotFoundError(f"bgq's SQL files for {dialect} are missing (looked in {packaged} and {source}).")


@dataclass(frozen=True)
class SqlFiles:
    schema: str  # the head schema, for a table that does not exist yet
    routines: dict[str, str]  # name -> CREATE statement (still with the placeholder)
    migrations: tuple[Migration, ...]  # migrations/, in order
    checksum: str  # of all of the above

    @classmethod
    def load(cls, dialect: str) -> SqlFiles:
        folder = sql_dir(dialect)
        names = [p.name for p in (*ALL_PROCS, *INTERNAL_PROCS)]
        schema = (folder / "schema.sql").read_text()
        routines = {name: (folder / f"{name}.sql").read_text() for name in names}
        loaded = migrations.load(folder / "migrations")
        digest = hashlib.sha256(schema.encode())
        digest.update((folder / _RULES).read_bytes())
        for name in sorted(routines):
            digest.update(name.encode() + b"\0" + routines[name].encode())
        for m in loaded:
            digest.update(b"migrations/" + m.name.encode() + b"\0" + m.text.encode())
        return cls(schema, routines, loaded, digest.hexdigest()[:16])


#: How long a claim waits for a group row that another transaction holds (a concurrent first claim
#: of the group) before it answers 'locked': rendered into the procedures as `group_lock_wait_s`
#: (PostgreSQL's lock_timeout of claim_job and claim_heads, MySQL's innodb_lock_wait_timeout for
#: that one statement, whose unit is whole seconds), so it is written once for both dialects and
#: the tests that wait it out read it from here.
GROUP_LOCK_WAIT_S = 3


def render(text: str, table: str, dialect: str) -> str:
    """A SQL file as it is installed: rendered by Jinja with `table` and the dialect's shared
    rules (db/<dialect>/macros/rules.sql), so a rule such as "due" is written once per dialect."""
    return _environment(dialect).from_string(text, globals=_rules(dialect, table)).render(table=table)


@functools.cache
def _environment(dialect: str) -> jinja2.Environment:
    import jinja2  # rendering is only needed when installing: `import bgq` stays lighter

    return jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)


@functools.cache
def _rules(dialect: str, table: str) -> dict[str, object]:
    """The shared rules' macros for `table` (a rule may name the table's other tables, as
    not_paused names {table}_pause), and the constants the procedures share."""
    env = _environment(dialect)
    rules = env.from_string((sql_dir(dialect) / _RULES).read_text()).make_module({"table": table})
    found: dict[str, object] = {k: v for k, v in vars(rules).items() if not k.startswith("_")}
    return found | {"group_lock_wait_s": GROUP_LOCK_WAIT_S}


#: The table the checked-in rendering (docs/sql/<dialect>/) is made for: the default table_name.
RENDERED_TABLE = "background_job"


def rendered_sql(dialect: str, table: str = RENDERED_TABLE) -> dict[str, str]:
    """What `bgq install-procs` runs for `table`, as a DBA would read it: "schema" (a new
    table's schema.sql), each migration as "migrations/<name>", then each routine's CREATE by
    name, in install order (callees first). The text is the real one: the same rendering."""
    files = SqlFiles.load(dialect)
    out = {"schema": render(files.schema, table, dialect).strip() + "\n"}
    for m in files.migrations:
        out[f"migrations/{m.name}"] = render(m.text, table, dialect).strip() + "\n"
    for name, text in files.routines.items():
        out[name] = render(text, table, dialect).strip() + "\n"
    return out


def _statements(text: str) -> list[str]:
    """Split schema.sql (or a PostgreSQL migration) on ';' at line ends, dropping comment-only chunks."""
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


def install(db: Database, table: str, *, lock_wait: float = migrations.LOCK_WAIT) -> bool:
    """Bring the tables to this package's schema (`_migrate`), then install the procedures: every
    one when the recorded version or checksum differs from the package's, else those missing,
    changed by hand or not yet fingerprinted (a partial install is repaired). One install at a
    time per table (migrations.install_lock; another one waits up to `lock_wait` seconds). Returns
    False when everything was already up to date."""
    files = SqlFiles.load(db.dialect.name)
    procs = Procs(db, table)
    with migrations.install_lock(db, table, lock_wait):
        migrated = _migrate(db, procs, table, files)
        return _install_routines(db, procs, table, files) or migrated


def _migrate(db: Database, procs: Procs, table: str, files: SqlFiles) -> bool:
    """A table that does not exist gets schema.sql, with every migration recorded as applied; an
    existing one gets its pending migrations, in order, each recorded when it is done. True when
    anything changed."""
    with db.transaction() as conn:
        exists = migrations.table_exists(db, conn, table)
    if not exists:
        # PostgreSQL: one transaction, so the tables and their record appear together. MySQL
        # commits each CREATE: schema.sql creates the jobs table last, and a run cut short before
        # the record is taken for a table without migration rows next time (see below).
        with db.transaction() as conn:
            procs.run(conn, _statements(render(files.schema, table, db.dialect.name)))
            migrations.record(procs, conn, files.migrations, f"with schema.sql {migrations.utc_now()}")
        return True
    with db.transaction() as conn:
        meta = _existing_meta(procs, conn, table)
    ahead = migrations.unknown(files.migrations, meta)
    if ahead:
        raise SchemaVersionError(
            f"Table {table!r} ({db.safe_url}) has migrations this bgq does not know ({', '.join(ahead)}): "
            "a newer bgq migrated it; run that version's `bgq install-procs`."
        )
    inferred = False
    if not migrations.recorded(meta):
        # Installed before migrations existed: the level comes from the recorded version
        # (migrations.LEGACY_LEVELS); each migration step also checks the catalogue, so a level
        # guessed too low is harmless.
        level = migrations.legacy_level(meta)
        if level:
            with db.transaction() as conn:
                value = f"inferred from version {meta.get('version')} {migrations.utc_now()}"
                migrations.record(procs, conn, files.migrations[:level], value)
                meta = procs.installed(conn)
            inferred = True
    todo = migrations.pending(files.migrations, meta)
    for migration in todo:
        _apply(db, procs, table, migration)
    return inferred or bool(todo)


def _existing_meta(procs: Procs, conn: Connection, table: str) -> dict[str, str]:
    try:
        return procs.installed(conn)
    except SchemaVersionError:
        raise SchemaVersionError(
            f"Table {table!r} exists but {table}_meta does not: it is not a bgq table (or its install "
            "never got that far); rename or drop it, then run `bgq install-procs` again."
        ) from None


def _apply(db: Database, procs: Procs, table: str, migration: Migration) -> None:
    """Run one migration and record it.

    PostgreSQL: its statements and its record in one transaction. MySQL: the file is one helper
    procedure, created, called once and dropped; its DDL commits implicitly, step by step, and
    each step checks information_schema first, so a migration cut short is completed by the next
    run (its record is written only once the call returned)."""
    text = render(migration.text, table, db.dialect.name).strip()
    with db.transaction() as conn:
        if db.dialect.name == "mysql":
            helper = migration.helper(table)
            if f"CREATE PROCEDURE {helper}()" not in text:
                raise ValueError(f"Migration {migration.name} must create the procedure {helper}().")
            statements = [
                f"DROP PROCEDURE IF EXISTS {helper}",
                text,
                f"CALL {helper}()",
                f"DROP PROCEDURE {helper}",
            ]
            procs.run(conn, statements)
        else:
            procs.run(conn, _statements(text))
        migrations.record(procs, conn, [migration], f"applied {migrations.utc_now()}")
    db.log.info(f"bgq: table {table}: applied migration {migration.name}")


def _install_routines(db: Database, procs: Procs, table: str, files: SqlFiles) -> bool:
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
        # record_install replaces every row: the migration rows are carried over.
        values = {k: v for k, v in procs.installed(conn).items() if k.startswith(MIGRATION_KEY)}
        values.update({"version": SCHEMA_VERSION, "checksum": files.checksum})
        values.update({_ROUTINE_KEY + name: fingerprint(found[name]) for name in files.routines})
        procs.record_install(conn, values)
    return True


def check_installed(db: Database, table: str) -> None:
    """Raise SchemaVersionError unless this package's schema and procedures are installed for
    `table`: every migration recorded as applied (none unknown), the recorded version and
    checksum, and every routine present as install-procs left it."""
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
    behind = migrations.pending(files.migrations, meta)
    if behind:
        raise SchemaVersionError(
            f"The bgq tables are behind this package's schema (migrations not applied: "
            f"{', '.join(m.name for m in behind)}): {hint}."
        )
    ahead = migrations.unknown(files.migrations, meta)
    if ahead:
        raise SchemaVersionError(
            f"The bgq tables were migrated by a newer bgq (migrations this package does not know: "
            f"{', '.join(ahead)}): use that version (table {table!r}, database {db.safe_url})."
        )
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
        if db.dialect.name == "mysql":  # a migration's helper that a failed run left behind
            for migration in SqlFiles.load("mysql").migrations:
                procs.run(conn, [f"DROP PROCEDURE IF EXISTS {migration.helper(table)}"])
        suffixes = ("_meta", "_group", "_worker", "_paused", "_schedule", "_fired", "")
        procs.run(conn, [f"DROP TABLE IF EXISTS {table}{suffix}" for suffix in suffixes])
        procs.run(conn, [db.dialect.drop_sql(table, "notify", True)])  # PostgreSQL's insert trigger
