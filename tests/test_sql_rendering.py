"""The SQL a DBA reads is the SQL bgq installs: docs/sql/<dialect>/ is `bgq sql`'s rendering of
every routine, migration and the schema for the default table, and it is current."""

from __future__ import annotations

from pathlib import Path

import pytest

from bgq.sql.install import RENDERED_TABLE, rendered_sql
from tests.support.cli import run_bgq

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("dialect", ["mysql", "postgres"])
def test_the_checked_in_rendering_is_current(dialect: str) -> None:
    folder = ROOT / "docs" / "sql" / dialect
    expected = rendered_sql(dialect)
    on_disk = {str(p.relative_to(folder))[: -len(".sql")]: p.read_text() for p in folder.rglob("*.sql")}
    stale = sorted(name for name in expected.keys() & on_disk.keys() if expected[name] != on_disk[name])
    assert not stale, f"docs/sql/{dialect} is not current for {stale}: run `make sql`"
    assert sorted(on_disk) == sorted(expected), "docs/sql has other files than bgq installs: run `make sql`"


@pytest.mark.parametrize("dialect", ["mysql", "postgres"])
def test_the_rendering_names_the_table_and_leaves_no_template(dialect: str) -> None:
    parts = rendered_sql(dialect, "acme_job")
    create = "CREATE PROCEDURE acme_job_claim_ids" if dialect == "mysql" else "FUNCTION acme_job_claim_ids"
    assert create in parts["claim_ids"]
    for name, text in parts.items():
        assert "{{" not in text and "{%" not in text, f"{name} still holds Jinja"
        assert RENDERED_TABLE + "_" not in text, f"{name} names the default table"


def test_bgq_sql_prints_one_routine_and_refuses_an_unknown_one() -> None:
    out = run_bgq("--table", "acme_job", "sql", "--dialect", "postgres", "hand_off")
    assert out.returncode == 0, out.stderr
    assert "acme_job_hand_off" in out.stdout and "-- ====" not in out.stdout
    bad = run_bgq("sql", "--dialect", "postgres", "no_such_routine")
    assert bad.returncode == 2 and "No routine 'no_such_routine'" in bad.stderr
    everything = run_bgq("sql", "--dialect", "mysql")
    assert everything.stdout.count("-- ==== ") == len(rendered_sql("mysql"))
