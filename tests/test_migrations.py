"""Numbered schema migrations: an old released schema, migrated by install-procs, is a fresh install.

tests/schemas/ holds the released schemas, frozen byte for byte from git history:
  v1_mysql.sql     `git show be8d362:db/mysql/schema.sql`     (the first release)
  v1_postgres.sql  `git show 45584db:db/postgres/schema.sql`  (the first PostgreSQL schema)
  v2_mysql.sql     `git show d3b4778:db/mysql/schema.sql`     (`bgq work`; its upgrade was by hand)
  v2_postgres.sql  `git show b50185f:db/postgres/schema.sql`
A table is set up as bgq of that time left it (the schema, then `version` in <table>_meta, no
migration rows), with jobs in several states, then `install` (the code behind `bgq install-procs`)
runs and the catalogue of every bgq object is compared with a fresh install of this package in
another table of the same database. An edit to schema.sql without its migration shows up there:
test_an_edit_to_schema_sql_without_a_migration_is_seen proves the comparison sees each kind.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import bgq.sql.install
from bgq.db import Database
from bgq.errors import LockTimeoutError, SchemaVersionError
from bgq.sql import migrations
from bgq.sql.calls import Procs
from bgq.sql.install import SqlFiles, _statements, check_installed, install, render, sql_dir, uninstall
from tests.support.helpers import unique_name, wait_until

SCHEMAS = Path(__file__).resolve().parent / "schemas"
# The jobs table's columns in version 1 (every later column is a migration's).
V1_COLUMNS = (
    "id, queue, priority, callback_name, parameters, parameters_json, state, created_at, last_attempt_at,"
    " number_of_attempts, error_message, serial_group, coalesce_threshold, identifier, postponed_by,"
    " processed_by_broker, execution_time, finished_at, pid, metadata, memory, mode, updated_at"
)
T0, T1, T2 = "2026-11-30 10:00:00.123456", "2026-11-30 10:05:00.5", "2026-11-30 10:06:01.000001"
# (queue, priority, callback, parameters, parameters_json, state, created_at, last_attempt_at,
#  attempts, error, group, coalesce, identifier, postponed_by, by_broker, execution_time,
#  finished_at, pid, metadata, memory, mode, updated_at)
JOBS = [
    ("general", 2, "mail", None, '{"to": "a@example.com"}', 1, T0, None, 0, None, None, None, None, None,
     0, None, None, None, None, None, "normal", T0),  # READY, ungrouped
    ("general", 1, "sync", None, '{"n": 1}', 2, T0, T1, 1, None, "g1", None, None, None,
     0, None, None, 4242, '{"host": "w1"}', None, "normal", T1),  # PROCESSING in g1
    ("general", 1, "sync", None, '{"n": 2}', 6, T0, None, 0, None, "g1", None, None, None,
     0, None, None, None, None, None, "normal", T0),  # WAITING behind it
    ("general", 3, "mail", None, "[]", 3, T0, T1, 1, None, None, None, "inv-7", None,
     0, 15, T2, 4242, None, '{"peak": 1024}', "unique", T2),  # FINISHED
    ("other", 1, "mail", None, "[]", 5, T0, T1, 3, "SMTP said no", None, 10, None, None,
     1, 3, T2, 4243, None, None, "normal", T2),  # PERMANENTLY_FAILED
    ("other", 2, "legacy", b"\x80\x04K\x01.", None, 4, T0, T1, 1, "timeout", None, None, None, 60000,
     0, 2, None, 4243, None, None, "recurring", T1),  # TEMPORARILY_FAILED, pickled parameters
    ("other", 2, "mail", None, "{}", 8, T0, None, 0, "broker down", None, None, None, None,
     0, None, None, None, None, None, "normal", T0),  # BROKER_FAILED
]  # fmt: skip


# --- setting up a table as an older bgq left it ---


def load_released(db: Database, table: str, version: str) -> None:
    """The released schema `version` for `table`, recorded as bgq of that time did, with jobs."""
    text = (SCHEMAS / f"v{version}_{db.dialect.name}.sql").read_text()
    marks = ", ".join(["%s"] * 22)
    columns = V1_COLUMNS.removeprefix("id, ")
    with db.transaction() as conn:
        Procs(db, table).run(conn, _statements(render(text, table, db.dialect.name)))
    with db.transaction() as conn:
        for job in JOBS:
            conn.exec_driver_sql(f"INSERT INTO {table} ({columns}) VALUES ({marks})", job)
        conn.exec_driver_sql(
            f"INSERT INTO {table}_group (serial_group, waiting_head_id, waiting_head_priority, updated_at)"
            " VALUES ('g1', 3, 1, %s)",
            (T1,),
        )
        for name, value in (("version", version), ("checksum", f"released-v{version}")):
            conn.exec_driver_sql(f"INSERT INTO {table}_meta (name, value) VALUES (%s, %s)", (name, value))


def rows(db: Database, table: str) -> dict[str, list[tuple[Any, ...]]]:
    """The rows an upgrade must keep: the jobs' version 1 columns and the group table."""
    with db.transaction() as conn:
        return {
            "jobs": [tuple(r) for r in conn.exec_driver_sql(f"SELECT {V1_COLUMNS} FROM {table} ORDER BY id")],
            "groups": [tuple(r) for r in conn.exec_driver_sql(f"SELECT * FROM {table}_group ORDER BY 1")],
        }


def meta(db: Database, table: str) -> dict[str, str]:
    with db.transaction() as conn:
        return Procs(db, table).installed(conn)


# --- the catalogue, with the table name normalised ---


def catalogue(db: Database, table: str) -> dict[str, Any]:
    """Every bgq object for `table` as the server's catalogue shows it, `table` written as <t>."""
    names = [table, f"{table}_group", f"{table}_meta"]
    with db.transaction() as conn:
        queries = _MYSQL if db.dialect.name == "mysql" else _POSTGRES
        if db.dialect.name == "mysql" and conn.exec_driver_sql(_MARIADB_PROBE).scalar_one():
            queries = {**queries, "checks": _MARIADB_CHECKS}
        found = {
            kind: sorted(
                (tuple(r) for r in conn.exec_driver_sql(sql, (names,) if "ANY" in sql else tuple(names))),
                key=repr,
            )
            for kind, sql in queries.items()
        }
        every = conn.exec_driver_sql(_ROUTINES[db.dialect.name])
        found["routines"] = sorted((tuple(r) for r in every if r[0].startswith(f"{table}_")), key=repr)
    return _normalise(found, table)


def _normalise(value: Any, table: str) -> Any:
    if isinstance(value, str):
        return value.replace(table, "<t>")
    if isinstance(value, dict):
        return {k: _normalise(v, table) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_normalise(v, table) for v in value)
    return value


_IN = "(%s, %s, %s)"
_MYSQL = {
    "tables": "SELECT table_name, engine, table_collation FROM information_schema.tables"
    f" WHERE table_schema = DATABASE() AND table_name IN {_IN}",
    # Sorted by (table, position): the column order is compared too (SELECT * sees it).
    "columns": "SELECT table_name, ordinal_position, column_name, column_type, is_nullable, column_default,"
    " extra, generation_expression, collation_name FROM information_schema.columns"
    f" WHERE table_schema = DATABASE() AND table_name IN {_IN}",
    "indexes": "SELECT table_name, index_name, seq_in_index, column_name, non_unique, sub_part, index_type"
    f" FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name IN {_IN}",
    "checks": "SELECT tc.table_name, tc.constraint_name, tc.constraint_type, cc.check_clause"
    " FROM information_schema.table_constraints AS tc LEFT JOIN information_schema.check_constraints AS cc"
    " ON cc.constraint_schema = tc.constraint_schema AND cc.constraint_name = tc.constraint_name"
    f" WHERE tc.table_schema = DATABASE() AND tc.table_name IN {_IN}",
    "triggers": "SELECT event_object_table, trigger_name, action_timing, event_manipulation,"
    " action_orientation, action_statement FROM information_schema.triggers"
    f" WHERE trigger_schema = DATABASE() AND event_object_table IN {_IN}",
}
# MariaDB names a JSON column's implicit check after the column (parameters_json, metadata, memory),
# the same in every table of the schema: matched by name alone, each row would meet every other
# table's, and their number change while other tests (xdist workers, other runs) create tables.
# MariaDB's check_constraints has table_name; MySQL 8's has not, and names checks per schema.
_MARIADB_PROBE = (
    "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = 'information_schema'"
    " AND table_name = 'CHECK_CONSTRAINTS' AND column_name = 'TABLE_NAME'"
)
_MARIADB_CHECKS = _MYSQL["checks"].replace(
    " AND cc.constraint_name = tc.constraint_name",
    " AND cc.constraint_name = tc.constraint_name AND cc.table_name = tc.table_name",
)
_POSTGRES = {
    "tables": "SELECT tablename FROM pg_catalog.pg_tables"
    " WHERE schemaname = current_schema() AND tablename = ANY(%s)",
    "columns": "SELECT table_name, ordinal_position, column_name, data_type, character_maximum_length,"
    " numeric_precision, is_nullable, column_default, is_identity, identity_generation, is_generated,"
    " generation_expression, collation_name FROM information_schema.columns"
    " WHERE table_schema = current_schema() AND table_name = ANY(%s)",
    # indexdef holds the columns in order, UNIQUE, the method and the partial predicate.
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_catalog.pg_indexes"
    " WHERE schemaname = current_schema() AND tablename = ANY(%s)",
    "checks": "SELECT c.conrelid::regclass::text, c.conname, c.contype, pg_get_constraintdef(c.oid)"
    " FROM pg_catalog.pg_constraint AS c WHERE c.conrelid::regclass::text = ANY(%s)",
    "triggers": "SELECT t.tgrelid::regclass::text, t.tgname, pg_get_triggerdef(t.oid)"
    " FROM pg_catalog.pg_trigger AS t WHERE NOT t.tgisinternal AND t.tgrelid::regclass::text = ANY(%s)",
}
_ROUTINES = {
    "mysql": "SELECT routine_name, routine_type FROM information_schema.routines"
    " WHERE routine_schema = DATABASE()",
    "postgres": "SELECT p.proname, p.prokind::text, pg_get_function_identity_arguments(p.oid)"
    " FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace"
    " WHERE n.nspname = current_schema()",
}


def differences(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[list[Any], list[Any]]]:
    """{kind: (only in old, only in new)} for every kind of object that differs."""
    out = {}
    for kind in sorted(set(old) | set(new)):
        a, b = old.get(kind, []), new.get(kind, [])
        if a != b:
            out[kind] = ([x for x in a if x not in b], [x for x in b if x not in a])
    return out


# --- fixtures ---


@pytest.fixture
def tables(db_url: str) -> Iterator[tuple[Database, str, str]]:
    """A database and two table names in it: `old` (a test sets it up) and `fresh` (installed now)."""
    db = Database(db_url)
    old, fresh = unique_name("bgqmig"), unique_name("bgqmig")
    try:
        install(db, fresh)
        yield db, old, fresh
    finally:
        for table in (old, fresh):
            uninstall(db, table)
        db.dispose()


# --- the tests ---


@pytest.mark.parametrize("version", ["1", "2"])
def test_a_released_schema_migrates_to_the_fresh_schema_and_keeps_its_rows(tables, version):
    db, old, fresh = tables
    load_released(db, old, version)
    before = rows(db, old)
    assert catalogue(db, old) != catalogue(db, fresh)  # (the comparison below compares something)
    with pytest.raises(SchemaVersionError, match="behind this package's schema"):
        check_installed(db, old)

    assert install(db, old) is True
    assert differences(catalogue(db, old), catalogue(db, fresh)) == {}
    assert rows(db, old) == before and len(before["jobs"]) == len(JOBS)
    check_installed(db, old)
    recorded = {k: v for k, v in meta(db, old).items() if k.startswith(migrations.MIGRATION_KEY)}
    expected = {m.key for m in SqlFiles.load(db.dialect.name).migrations}
    assert set(recorded) == expected
    # Version 1 ran every migration; a version 2 table had those up to its level already (read
    # from the recorded version, migrations.LEGACY_LEVELS) and ran the later ones.
    level = migrations.LEGACY_LEVELS[version]
    for number, migration in enumerate(SqlFiles.load(db.dialect.name).migrations):
        how = f"inferred from version {version} " if number < level else "applied "
        assert recorded[migration.key].startswith(how), recorded


def test_installing_twice_changes_nothing(tables):
    db, old, fresh = tables
    load_released(db, old, "1")
    assert install(db, old) is True
    before = {t: (catalogue(db, t), meta(db, t)) for t in (old, fresh)}
    kept = rows(db, old)
    assert install(db, old) is False
    assert install(db, fresh) is False
    for table, (objects, recorded) in before.items():
        assert differences(objects, catalogue(db, table)) == {}
        assert meta(db, table) == recorded
    assert rows(db, old) == kept


# The first step of each dialect's migration 0001, as an interrupted run (or a DBA following the
# version 2 README) left it.
FIRST_STEP = {
    "mysql": "ALTER TABLE {t} ADD COLUMN ungrouped_priority INT GENERATED ALWAYS AS"
    " (CASE WHEN serial_group IS NULL AND state IN (1, 4, 6, 8) THEN priority END)"
    " STORED AFTER pending_group",
    "postgres": "CREATE INDEX {t}_ungrouped ON {t} (priority, id)"
    " WHERE serial_group IS NULL AND state IN (1, 4, 6, 8)",
}


@pytest.mark.dialect_differs(
    mysql="indexes",
    postgres="triggers",
    reason="what 0001 still lacks after its first step: an index on MySQL, a trigger on PostgreSQL",
)
def test_a_migration_cut_short_after_its_first_step_completes_on_the_next_install(tables, dialect_expects):
    db, old, fresh = tables
    load_released(db, old, "1")
    with db.transaction() as conn:
        Procs(db, old).run(conn, [FIRST_STEP[db.dialect.name].format(t=old)])
    partial = differences(catalogue(db, old), catalogue(db, fresh))
    # Half done: the step is there, the rest is not (MySQL: 0001's index; PostgreSQL: its trigger).
    assert dialect_expects in partial, partial

    assert install(db, old) is True
    assert differences(catalogue(db, old), catalogue(db, fresh)) == {}
    check_installed(db, old)


def test_check_installed_refuses_a_table_whose_migrations_are_behind(tables):
    db, _, fresh = tables
    last = SqlFiles.load(db.dialect.name).migrations[-1]
    with db.transaction() as conn:
        conn.exec_driver_sql(f"DELETE FROM {fresh}_meta WHERE name = %s", (last.key,))
    with pytest.raises(SchemaVersionError) as caught:
        check_installed(db, fresh)
    message = str(caught.value)
    assert f"migrations not applied: {last.name}" in message and "run `bgq install-procs`" in message
    assert "\n" not in message
    assert install(db, fresh) is True  # the step finds its object there and skips it
    check_installed(db, fresh)


def test_a_table_migrated_by_a_newer_bgq_is_refused(tables):
    db, _, fresh = tables
    with db.transaction() as conn:
        conn.exec_driver_sql(
            f"INSERT INTO {fresh}_meta (name, value) VALUES (%s, 'applied')",
            (migrations.MIGRATION_KEY + "9999_next",),
        )
    with pytest.raises(SchemaVersionError, match="migrated by a newer bgq .*9999_next"):
        check_installed(db, fresh)
    with pytest.raises(SchemaVersionError, match="migrations this bgq does not know \\(9999_next\\)"):
        install(db, fresh)


def test_a_second_install_waits_for_the_first_one(tables, db_url, caplog):
    db, old, _ = tables
    other = Database(db_url)
    result: list[bool] = []
    try:
        with migrations.install_lock(other, old):
            with pytest.raises(LockTimeoutError, match="Another `bgq install-procs` is running"):
                install(db, old, lock_wait=0.5)
            caplog.clear()
            with caplog.at_level("WARNING", logger="bgq"):
                waiting = threading.Thread(target=lambda: result.append(install(db, old)))
                waiting.start()
                wait_until(
                    lambda: "another install-procs is running" in caplog.text, "the second install waits"
                )
            assert waiting.is_alive() and result == []
            with db.transaction() as conn:
                assert not migrations.table_exists(db, conn, old)
        waiting.join(timeout=120)
        assert result == [True]
        check_installed(db, old)
    finally:
        other.dispose()


def test_two_installs_racing_on_an_old_table_migrate_it_once(tables, db_url):
    db, old, fresh = tables
    load_released(db, old, "1")
    before = rows(db, old)
    dbs = [Database(db_url), Database(db_url)]
    results: list[object] = []
    start = threading.Barrier(2)

    def run(one: Database) -> None:
        start.wait()
        try:
            results.append(install(one, old))
        except Exception as exc:  # reported by the assertion below
            results.append(exc)

    try:
        threads = [threading.Thread(target=run, args=(one,)) for one in dbs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
    finally:
        for one in dbs:
            one.dispose()
    assert sorted(results, key=repr) == [False, True]  # one migrated, the other found it done
    assert differences(catalogue(db, old), catalogue(db, fresh)) == {}
    assert rows(db, old) == before


# Edits someone might make to schema.sql: (kind of object the comparison must see, {dialect:
# (text in schema.sql, its replacement)}); an empty text appends the replacement to the file.
EDITS = {
    "new column": ("columns", {
        "mysql": ("    mode VARCHAR(16) NOT NULL DEFAULT 'normal',\n",
                  "    mode VARCHAR(16) NOT NULL DEFAULT 'normal',\n    note TEXT NULL,\n"),
        "postgres": ("    mode VARCHAR(16) NOT NULL DEFAULT 'normal',\n",
                     "    mode VARCHAR(16) NOT NULL DEFAULT 'normal',\n    note TEXT NULL,\n"),
    }),
    "default": ("columns", {
        "mysql": ("number_of_attempts INT NOT NULL DEFAULT 0", "number_of_attempts INT NOT NULL DEFAULT 1"),
        "postgres": ("number_of_attempts INTEGER NOT NULL DEFAULT 0",
                     "number_of_attempts INTEGER NOT NULL DEFAULT 1"),
    }),
    "type and nullability": ("columns", {
        "mysql": ("    pid INT NULL,", "    pid BIGINT NOT NULL DEFAULT 0,"),
        "postgres": ("    pid INTEGER NULL,", "    pid BIGINT NOT NULL DEFAULT 0,"),
    }),
    "index columns": ("indexes", {
        "mysql": ("KEY {{ table }}_identifier (identifier)", "KEY {{ table }}_identifier (identifier, id)"),
        "postgres": ("ON {{ table }} (identifier);", "ON {{ table }} (identifier, id);"),
    }),
    "unique": ("indexes", {
        "mysql": ("    KEY {{ table }}_running_group", "    UNIQUE KEY {{ table }}_running_group"),
        "postgres": ("CREATE UNIQUE INDEX IF NOT EXISTS {{ table }}_running_group",
                     "CREATE INDEX IF NOT EXISTS {{ table }}_running_group"),
    }),
    # MySQL: a generated column's expression; PostgreSQL: a partial index's predicate.
    "expression": ("columns", {
        "mysql": ("(CASE WHEN state = 2 THEN serial_group END)",
                  "(CASE WHEN state = 2 AND priority > 0 THEN serial_group END)"),
        "postgres": ("WHERE state = 6;", "WHERE state = 6 AND priority > 0;"),
    }),
    "check constraint": ("checks", {
        "mysql": ("'unique', 'recurring')", "'unique', 'recurring', 'other')"),
        "postgres": ("'unique', 'recurring')", "'unique', 'recurring', 'other')"),
    }),
    "trigger": ("triggers", {
        "mysql": ("", "\nCREATE TRIGGER {{ table }}_touch"
                  " BEFORE UPDATE ON {{ table }} FOR EACH ROW SET NEW.pid = NEW.pid;\n"),
        "postgres": ("", "\nCREATE TRIGGER {{ table }}_touch AFTER UPDATE ON {{ table }}"
                     " FOR EACH STATEMENT EXECUTE FUNCTION {{ table }}_notify();\n"),
    }),
    "routine": ("routines", {
        "mysql": ("", "\nCREATE FUNCTION {{ table }}_extra() RETURNS INT DETERMINISTIC RETURN 1;\n"),
        "postgres": ("", "\nCREATE FUNCTION {{ table }}_extra() RETURNS INTEGER"
                     " LANGUAGE sql AS 'SELECT 1';\n"),
    }),
}  # fmt: skip


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edit_to_schema_sql_without_a_migration_is_seen(tables, edit, tmp_path, monkeypatch):
    """What the comparison above would report if schema.sql changed and no migration did."""
    db, old, _ = tables
    load_released(db, old, "1")
    install(db, old)
    kind, by_dialect = EDITS[edit]
    if edit == "expression" and db.dialect.name == "postgres":
        kind = "indexes"
    before, after = by_dialect[db.dialect.name]
    folder = tmp_path / db.dialect.name
    shutil.copytree(sql_dir(db.dialect.name), folder)
    schema = (folder / "schema.sql").read_text()
    if before:
        assert before in schema
        schema = schema.replace(before, after, 1)
    else:
        schema += after
    (folder / "schema.sql").write_text(schema)
    monkeypatch.setattr(bgq.sql.install, "sql_dir", lambda dialect: tmp_path / dialect)
    edited = unique_name("bgqmig")
    try:
        install(db, edited)
        found = differences(catalogue(db, old), catalogue(db, edited))
    finally:
        uninstall(db, edited)
        if edit == "routine":
            with db.transaction() as conn:
                Procs(db, edited).run(conn, [db.dialect.drop_sql(edited, "extra", True)])
    assert kind in found, found
