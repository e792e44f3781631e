"""The `bgq` command line: argument errors, install-procs, process (tests/support/cli.py runs it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bgq import JobState, Queue
from bgq.db import Database
from bgq.sql.install import uninstall
from tests.conftest import DATABASE_URLS
from tests.support.cli import BGQ, run_bgq
from tests.support.helpers import state_of, unique_name

UNREACHABLE = {
    "mysql": "mysql+pymysql://root@127.0.0.1:1/test",
    "postgres": "postgresql+psycopg://postgres@127.0.0.1:1/test",
}


def bgq(*args: str, pythonpath: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120):
    """`bgq ARGS` with a clean bgq environment; a one-shot command runs in this process."""
    return run_bgq(*args, pythonpath=pythonpath, env=env, timeout=timeout)


def write_app(tmp_path: Path, url: str, table: str, *, extra: str = "") -> str:
    """An application module for --app: a Queue whose callback writes a marker file."""
    module = unique_name("bgqapp")
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            f"""
            from pathlib import Path

            import bgq

            MARKS = Path({str(tmp_path)!r})


            def touch(name):
                (MARKS / name).write_text("done")


            queue = bgq.Queue(
                callbacks={{"touch": touch}},
                database_url={url!r},
                table_name={table!r},
                queue="general",
            )


            def make_queue():
                return queue
            """
        )
        + extra
    )
    return module


def _uninstall(url: str, table: str) -> None:
    """Drop what install-procs created for `table` (a test's own table)."""
    db = Database(url)
    try:
        uninstall(db, table)
    finally:
        db.dispose()


def assert_clean_failure(result, code: int | None = None) -> None:
    """Failed with a message of bgq's own: non-zero, on stderr, without a Python traceback."""
    if code is None:
        assert result.returncode != 0, result
    else:
        assert result.returncode == code, result
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.strip(), result


# --- no database needed ---


def test_console_script_exists():
    assert Path(BGQ).exists(), BGQ


def test_help():
    result = bgq("--help")
    assert result.returncode == 0, result.stderr
    for command in ("install-procs", "process", "requeue", "demo"):
        assert command in result.stdout


def test_process_without_app_names_the_option():
    result = bgq("process")
    assert_clean_failure(result, 2)
    assert "--app" in result.stderr


@pytest.mark.parametrize(
    ("app", "expected"),
    [
        ("nosuchmodule_bgq_test:queue", "Cannot load 'nosuchmodule_bgq_test:queue'"),
        ("os:no_such_attribute", "Cannot load 'os:no_such_attribute'"),
        ("os:path", "'os:path' is not a bgq.Queue (got module)"),
        ("os:sep", "'os:sep' is not a bgq.Queue (got str)"),
        ("no_colon_here", "--app must look like 'package.module:queue'"),
        (":queue", "--app must look like 'package.module:queue'"),
    ],
)
def test_bad_app(app, expected):
    result = bgq("--app", app, "process")
    assert_clean_failure(result, 2)
    assert expected in result.stderr


def test_bad_app_from_environment_variable():
    result = bgq("process", env={"BGQ_APP": "nosuchmodule_bgq_test:queue"})
    assert_clean_failure(result, 2)
    assert "nosuchmodule_bgq_test" in result.stderr


def test_app_whose_queue_config_is_invalid_fails_cleanly(tmp_path):
    """A misconfigured Queue in the app module is a clear message, not a traceback."""
    module = unique_name("bgqbad")
    (tmp_path / f"{module}.py").write_text(
        "import bgq\n"
        "queue = bgq.Queue(callbacks={'x': print}, table_name='bad-name',\n"
        "                  database_url='mysql+pymysql://root@127.0.0.1:1/test')\n"
    )
    result = bgq("--app", f"{module}:queue", "process", pythonpath=tmp_path)
    assert_clean_failure(result, 2)
    assert "Invalid table name 'bad-name'" in result.stderr


@pytest.mark.parametrize("table", ["bad-name", "1abc", "x;drop", "a" * 41])
def test_install_procs_bad_table(table):
    result = bgq("--database-url", DATABASE_URLS["mysql"], "--table", table, "install-procs")
    assert_clean_failure(result, 2)
    assert "Invalid table name" in result.stderr


@pytest.mark.parametrize("url", ["sqlite:///x.db", "not a url"])
def test_install_procs_unsupported_or_invalid_url(url):
    result = bgq("--database-url", url, "--table", "t1", "install-procs")
    assert_clean_failure(result, 1)
    assert "database" in result.stderr.lower()


@pytest.mark.parametrize("dialect_name", ["mysql", "postgres"])
def test_install_procs_unreachable_database(dialect_name):
    result = bgq("--database-url", UNREACHABLE[dialect_name], "--table", "t1", "install-procs", timeout=60)
    assert_clean_failure(result, 1)
    assert "Cannot reach" in result.stderr


# --- real databases ---


@pytest.mark.parametrize("prefix", ["bgqcli", "BgqCli"])  # PostgreSQL folds the capitals, MySQL keeps them
def test_install_procs_twice(dialect, db_url, prefix):
    table = unique_name(prefix)
    try:
        first = bgq("--database-url", db_url, "--table", table, "install-procs")
        assert first.returncode == 0, first.stderr
        assert first.stdout.startswith(f"installed: table {table} on ")
        second = bgq("--database-url", db_url, "--table", table, "install-procs")
        assert second.returncode == 0, second.stderr
        assert second.stdout.startswith(f"already up to date: table {table} on ")
        alias = bgq("--database-url", db_url, "--table", table, "update-schema")
        assert alias.returncode == 0, alias.stderr
        assert alias.stdout.startswith("already up to date")
    finally:
        _uninstall(db_url, table)


def test_install_procs_through_the_app(dialect, db_url, tmp_path):
    table = unique_name("bgqcli")
    module = write_app(tmp_path, db_url, table)
    try:
        first = bgq("--app", f"{module}:queue", "install-procs", pythonpath=tmp_path)
        assert first.returncode == 0, first.stderr
        assert first.stdout.startswith(f"installed: table {table} on ")
        second = bgq("--app", f"{module}:make_queue", "install-procs", pythonpath=tmp_path)
        assert second.returncode == 0, second.stderr
        assert second.stdout.startswith(f"already up to date: table {table} on ")
    finally:
        _uninstall(db_url, table)


def test_process_runs_a_published_job(make_queue, installed, tmp_path):
    module = write_app(tmp_path, installed.url, installed.table)
    job_id = make_queue(callbacks={"touch": lambda name: None}).publish("touch", ["mark-1"])
    result = bgq("--app", f"{module}:queue", "process", pythonpath=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "claimed 1" in result.stdout
    assert state_of(installed, job_id) == JobState.FINISHED
    assert (tmp_path / "mark-1").read_text() == "done"


def test_process_with_app_from_environment_and_nothing_due(installed, tmp_path):
    module = write_app(tmp_path, installed.url, installed.table)
    result = bgq("process", pythonpath=tmp_path, env={"BGQ_APP": f"{module}:make_queue"})
    assert result.returncode == 0, result.stderr
    assert "nothing due" in result.stdout


def test_database_url_option_overrides_the_apps(make_queue, installed, tmp_path):
    module = write_app(tmp_path, UNREACHABLE["mysql"], installed.table)
    job_id = make_queue(callbacks={"touch": lambda name: None}).publish("touch", ["mark-2"])
    result = bgq("--app", f"{module}:queue", "--database-url", installed.url, "process", pythonpath=tmp_path)
    assert result.returncode == 0, result.stderr
    assert state_of(installed, job_id) == JobState.FINISHED


def test_process_refuses_a_mismatched_version(make_queue, installed, tmp_path):
    module = write_app(tmp_path, installed.url, installed.table)
    job_id = make_queue(callbacks={"touch": lambda name: None}).publish("touch", ["mark-3"])
    (original,) = installed.sql("SELECT value FROM {t}_meta WHERE name = 'version'")
    installed.sql("UPDATE {t}_meta SET value = '0' WHERE name = 'version'")
    try:
        result = bgq("--app", f"{module}:queue", "process", pythonpath=tmp_path)
    finally:
        installed.sql("UPDATE {t}_meta SET value = %s WHERE name = 'version'", (original["value"],))
    assert_clean_failure(result, 1)
    assert "bgq install-procs" in result.stderr
    assert state_of(installed, job_id) == JobState.READY
    assert not (tmp_path / "mark-3").exists()


def test_process_on_a_table_that_is_not_installed(tmp_path, dialect, db_url):
    module = write_app(tmp_path, db_url, unique_name("bgqnone"))
    result = bgq("--app", f"{module}:queue", "process", pythonpath=tmp_path)
    assert_clean_failure(result, 1)
    assert "bgq install-procs" in result.stderr


def test_web_on_a_table_that_is_not_installed_refuses_to_start(dialect, db_url):
    """As process and work do: one line, instead of a console whose every page is a 500."""
    pytest.importorskip("starlette", reason="the web extra is not installed (pip install 'bgq[web]')")
    args = ("--database-url", db_url, "--table", unique_name("bgqnone"), "web", "--token", "t", "--port", "0")
    try:
        result = bgq(*args, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("bgq web started serving a table where bgq is not installed")
    assert_clean_failure(result, 1)
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "bgq is not installed" in result.stderr and "bgq install-procs" in result.stderr
    assert result.stdout == ""


def test_process_unreachable_database(tmp_path):
    module = write_app(tmp_path, UNREACHABLE["mysql"], "background_job")
    result = bgq("--app", f"{module}:queue", "process", pythonpath=tmp_path, timeout=60)
    assert_clean_failure(result, 1)
    assert "Cannot reach" in result.stderr


def test_the_command_line_starts_without_the_orm_the_async_driver_or_the_template_engine():
    """Every `bgq` command (cron runs `bgq process` every minute on each host) pays for what
    `import bgq.cli` loads: SQLAlchemy's ORM, psycopg's asyncio side and Jinja2 are loaded only
    by what needs them (an application's Session, publish_async, install-procs)."""
    heavy = ("sqlalchemy.orm", "psycopg", "jinja2")
    probe = f"import sys, bgq.cli; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_process_exits_1_when_a_claim_of_its_pass_fails(tmp_path, dialect, db_url):
    """A pass whose claim the database refuses (here: the claim procedure was dropped while the
    first job ran) says so in one line and exits 1, so cron's monitoring sees it; the job that
    ran is still written. A pass whose callback fails is not an error of the pass (exit 0)."""
    table = unique_name("bgqfail")
    kind = "PROCEDURE" if dialect == "mysql" else "FUNCTION"
    module = unique_name("bgqapp")
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            f"""
            from sqlalchemy import create_engine, text

            import bgq


            def sabotage():
                engine = create_engine({db_url!r})
                with engine.begin() as conn:
                    conn.execute(text("DROP {kind} {table}_claim_batch"))
                engine.dispose()


            def broken():
                raise RuntimeError("the callback's own failure")


            queue = bgq.Queue(
                callbacks={{"sabotage": sabotage, "broken": broken}},
                database_url={db_url!r},
                table_name={table!r},
                queue="general",
            )
            """
        )
    )
    app = ("--app", f"{module}:queue")
    assert bgq(*app, "install-procs", pythonpath=tmp_path).returncode == 0
    try:
        queue = Queue(callbacks={"sabotage": print, "broken": print}, database_url=db_url, table_name=table,
                      queue="general")  # fmt: skip
        broken = queue.publish("broken")
        result = bgq(*app, "process", pythonpath=tmp_path)
        assert result.returncode == 0, result
        assert (queue.get_job(broken) or {})["state"] != JobState.FINISHED  # failed, retried later
        job = queue.publish("sabotage")
        result = bgq(*app, "process", pythonpath=tmp_path)
        assert result.returncode == 1, result
        assert "error(s) in this pass" in result.stderr
        assert "Traceback" not in result.stderr
        assert (queue.get_job(job) or {})["state"] == JobState.FINISHED
        queue.close()
    finally:
        _uninstall(db_url, table)
