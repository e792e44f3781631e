"""The installed routines are checked by name and definition; install-procs repairs a partial install."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bgq.db import Database
from bgq.errors import SchemaVersionError
from bgq.sql.calls import ALL_PROCS, INTERNAL_PROCS, Procs
from bgq.sql.install import check_installed, install, render, sql_dir, uninstall
from tests.support.helpers import unique_name
from tests.test_cli import assert_clean_failure, bgq, write_app


@pytest.fixture
def fresh(db_url: str) -> Iterator[tuple[Database, str]]:
    """A table of the test's own with bgq installed (the test breaks it), dropped afterwards."""
    db, table = Database(db_url), unique_name("bgqinst")
    install(db, table)
    yield db, table
    try:
        uninstall(db, table)
    finally:
        db.dispose()


def _drop(db: Database, table: str, name: str) -> None:
    function = any(p.function for p in ALL_PROCS if p.name == name)
    with db.transaction() as conn:
        Procs(db, table).run(conn, [db.dialect.drop_sql(table, name, function)])


def _present(db: Database, table: str) -> set[str]:
    with db.transaction() as conn:
        return set(Procs(db, table).routines(conn))


def test_a_fresh_install_passes_the_check_and_lists_every_routine(fresh):
    db, table = fresh
    check_installed(db, table)
    assert _present(db, table) == {p.name for p in (*ALL_PROCS, *INTERNAL_PROCS)}


def test_a_dropped_procedure_fails_the_check_and_names_it(fresh):
    db, table = fresh
    _drop(db, table, "heartbeat")
    with pytest.raises(SchemaVersionError) as caught:
        check_installed(db, table)
    message = str(caught.value)
    assert f"missing {table}_heartbeat" in message and "bgq install-procs" in message
    assert "\n" not in message


def test_install_procs_repairs_a_dropped_procedure(fresh, db_url):
    db, table = fresh
    _drop(db, table, "heartbeat")
    _drop(db, table, "predecessor")  # a function, and one the others call
    repaired = bgq("--database-url", db_url, "--table", table, "install-procs")
    assert repaired.returncode == 0, repaired.stderr
    assert repaired.stdout.startswith(f"installed: table {table} on ")
    assert {"heartbeat", "predecessor"} <= _present(db, table)
    check_installed(db, table)
    again = bgq("--database-url", db_url, "--table", table, "install-procs")
    assert again.returncode == 0 and again.stdout.startswith("already up to date"), again


def test_a_procedure_changed_by_hand_fails_the_check_and_install_procs_restores_it(fresh, dialect):
    db, table = fresh
    # The same procedure with one extra comment line in its body: same name, other definition.
    text = render((sql_dir(dialect) / "requeue.sql").read_text(), table, dialect)
    assert "BEGIN\n" in text
    edited = text.replace("BEGIN\n", "BEGIN\n    -- edited by hand\n", 1)
    _drop(db, table, "requeue")
    with db.transaction() as conn:
        Procs(db, table).run(conn, [edited.strip()])
    with pytest.raises(SchemaVersionError, match=f"changed since install {table}_requeue"):
        check_installed(db, table)
    assert install(db, table) is True
    check_installed(db, table)
    assert install(db, table) is False


def test_bgq_process_with_a_procedure_missing_fails_with_one_line(fresh, db_url, tmp_path):
    db, table = fresh
    _drop(db, table, "heartbeat")
    module = write_app(tmp_path, db_url, table)
    result = bgq("--app", f"{module}:queue", "process", pythonpath=tmp_path)
    assert_clean_failure(result, 1)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"missing {table}_heartbeat" in lines[0] and "bgq install-procs" in lines[0]
    assert result.stdout == ""


def test_an_install_recorded_before_fingerprints_is_accepted_and_fingerprinted_by_install_procs(fresh):
    """Meta rows of an older bgq (version and checksum only): the Queue checks names; install-procs
    reinstalls and records the fingerprints, then is up to date."""
    db, table = fresh
    with db.transaction() as conn:
        conn.exec_driver_sql(f"DELETE FROM {table}_meta WHERE name LIKE %s", ("routine:%",))
    check_installed(db, table)
    _drop(db, table, "monitor")
    with pytest.raises(SchemaVersionError, match=f"missing {table}_monitor"):
        check_installed(db, table)
    assert install(db, table) is True
    with db.transaction() as conn:
        recorded = {n for n in Procs(db, table).installed(conn) if n.startswith("routine:")}
    assert recorded == {f"routine:{p.name}" for p in (*ALL_PROCS, *INTERNAL_PROCS)}
    check_installed(db, table)
    assert install(db, table) is False
