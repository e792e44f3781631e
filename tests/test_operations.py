"""Operations: unfinished identifiers, the monitor, clear-finished, and per-host command locking.

Queue methods on both dialects, and the `bgq` commands as real subprocesses (checklists 44, 45,
88, 89, 90, 91, 103).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from bgq import JobState, Queue
from bgq.cli.cmdlock import CommandLockedError, command_lock, lock_name, locks_dir
from bgq.cli.commands import queue_lock_name
from tests.support.helpers import set_row, state_of
from tests.test_cli import bgq, write_app

UTC = dt.UTC
OLD = dt.datetime(2024, 5, 1, 10, 0, 0, 250000, tzinfo=UTC)  # long before the server's clock


def job(queue: Queue, installed, state: int | None = None, *, identifier=None, **columns) -> int:
    job_id = queue.publish("noop", identifier=identifier)
    if state is not None:
        columns["state"] = state
    if columns:
        set_row(installed, job_id, **columns)
    return job_id


def midnight() -> dt.datetime:
    return dt.datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


# --- get_unfinished_job_identifiers ---


def test_checklist_44_terminal_states_do_not_count_and_processing_can_be_left_out(make_queue, installed):
    queue = make_queue()
    for state in (1, 2, 3, 4, 5, 6, 7, 8, -1):
        job(queue, installed, state, identifier=f"s{state}")
    unfinished = ["s-1", "s1", "s2", "s4", "s6", "s8"]
    assert queue.get_unfinished_job_identifiers() == unfinished
    assert queue.get_unfinished_job_identifiers(exclude_processing=True) == [
        s for s in unfinished if s != "s2"
    ]
    assert queue.get_unfinished_job_identifiers(["s2", "s3", "s5", "s7"]) == ["s2"]
    assert queue.get_unfinished_job_identifiers(["s2", "s3"], exclude_processing=True) == []


def test_checklist_45_no_argument_gives_every_distinct_non_null_identifier(make_queue, installed):
    queue = make_queue()
    for identifier in ("b", "a", "b", None, "c"):
        job(queue, installed, identifier=identifier)
    job(queue, installed, 3, identifier="c")
    job(queue, installed, 3, identifier="done")
    assert queue.get_unfinished_job_identifiers() == ["a", "b", "c"]
    assert queue.get_unfinished_job_identifiers(()) == ["a", "b", "c"]
    assert queue.get_unfinished_job_identifiers(["c", "zz", "a"]) == ["a", "c"]


def test_unfinished_identifiers_are_the_queues_own(make_queue, installed):
    mine, other = make_queue(queue="general"), make_queue(queue="other")
    job(mine, installed, identifier="mine")
    job(other, installed, identifier="theirs")
    assert mine.get_unfinished_job_identifiers() == ["mine"]
    assert other.get_unfinished_job_identifiers(["mine", "theirs"]) == ["theirs"]


def test_unfinished_identifiers_argument_checks(make_queue, installed):
    queue = make_queue()
    job(queue, installed, identifier="x" * 255)
    with pytest.raises(TypeError):
        queue.get_unfinished_job_identifiers("abc")
    with pytest.raises(TypeError):
        queue.get_unfinished_job_identifiers([1])
    # An identifier that cannot be stored matches nothing (and never means "all").
    assert queue.get_unfinished_job_identifiers(["x" * 256]) == []
    assert queue.get_unfinished_job_identifiers(["x" * 255, "x" * 300]) == ["x" * 255]


# --- report_stuck_jobs ---


def test_checklist_88_report_counts_and_oldest(make_queue, installed):
    queue = make_queue()
    now = dt.datetime.now(UTC)
    job(queue, installed, 4, created_at=OLD)
    job(queue, installed, 4, created_at=OLD + dt.timedelta(days=3))
    job(queue, installed, 5, created_at=OLD + dt.timedelta(days=1))
    # started two days ago, heartbeat just now: counts (measured from last_attempt_at)
    job(queue, installed, 2, last_attempt_at=now - dt.timedelta(days=2), updated_at=now)
    # started an hour ago, no heartbeat for days: does not count
    job(queue, installed, 2, last_attempt_at=now - dt.timedelta(hours=1), updated_at=OLD)
    job(queue, installed, 1, created_at=OLD)
    job(queue, installed, 3, created_at=OLD)

    report = queue.report_stuck_jobs()

    assert list(report) == [4, 5, 2]
    assert report[4] == {"count": 2, "oldest_since": OLD}
    assert report[5] == {"count": 1, "oldest_since": OLD + dt.timedelta(days=1)}
    assert report[2]["count"] == 1
    assert abs(report[2]["oldest_since"] - (now - dt.timedelta(days=2))) < dt.timedelta(seconds=1)


def test_checklist_89_nothing_logged_when_nothing_is_stuck(make_queue, installed, caplog):
    queue = make_queue()
    job(queue, installed)  # READY
    job(queue, installed, 3)
    caplog.set_level(logging.DEBUG, logger="bgq")
    report = queue.report_stuck_jobs()
    assert report == {
        4: {"count": 0, "oldest_since": None},
        5: {"count": 0, "oldest_since": None},
        2: {"count": 0, "oldest_since": None},
    }
    assert caplog.records == []


def test_checklist_89_only_temporary_failures_log_a_warning(make_queue, installed, caplog):
    queue = make_queue()
    job(queue, installed, 4, created_at=OLD)
    job(queue, installed, 4, created_at=OLD + dt.timedelta(hours=1))
    caplog.set_level(logging.DEBUG, logger="bgq")
    queue.report_stuck_jobs()
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "bgq: Stuck jobs report: 2x TEMPORARILY_FAILED (oldest 2024-05-01 10:00:00 UTC).")
    ]


def test_checklist_89_a_permanent_failure_logs_critical(make_queue, installed, caplog):
    queue = make_queue()
    job(queue, installed, 4, created_at=OLD + dt.timedelta(days=1))
    job(queue, installed, 5, created_at=OLD)
    caplog.set_level(logging.DEBUG, logger="bgq")
    queue.report_stuck_jobs()
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.CRITICAL,
            "bgq: Stuck jobs report: 1x TEMPORARILY_FAILED (oldest 2024-05-02 10:00:00 UTC), "
            "1x PERMANENTLY_FAILED (oldest 2024-05-01 10:00:00 UTC).",
        )
    ]


def test_checklist_89_a_long_run_logs_critical(make_queue, installed, caplog):
    queue = make_queue()
    job(queue, installed, 2, last_attempt_at=OLD, updated_at=dt.datetime.now(UTC))
    caplog.set_level(logging.DEBUG, logger="bgq")
    queue.report_stuck_jobs()
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.CRITICAL,
            "bgq: Stuck jobs report: 1x PROCESSING running longer than 24 hours "
            "(since 2024-05-01 10:00:00 UTC).",
        )
    ]


# --- clear_finished_jobs ---


def test_checklist_91_clear_finished_jobs_deletes_only_finished_rows(make_queue, installed):
    queue = make_queue()
    ids = {state: job(queue, installed, state, created_at=OLD) for state in (1, 2, 3, 4, 5, 6, 7, 8)}
    fresh = job(queue, installed, 3)
    assert queue.clear_finished_jobs() == 2
    assert [state_of(installed, ids[s]) for s in (1, 2, 4, 5, 6, 7, 8)] == [1, 2, 4, 5, 6, 7, 8]
    assert state_of(installed, ids[3]) is None and state_of(installed, fresh) is None


@pytest.mark.parametrize("days", [None, 0])
def test_checklist_91_none_or_0_days_deletes_every_finished_row(make_queue, installed, days):
    queue = make_queue()
    old, new = job(queue, installed, 3, created_at=OLD), job(queue, installed, 3)
    assert queue.clear_finished_jobs(days) == 2
    assert state_of(installed, old) is None and state_of(installed, new) is None


def test_checklist_91_days_keeps_rows_created_after_today_midnight_minus_days(make_queue, installed):
    queue = make_queue()
    cutoff = midnight() - dt.timedelta(days=2)
    before = job(queue, installed, 3, created_at=cutoff - dt.timedelta(seconds=1))
    at_cutoff = job(queue, installed, 3, created_at=cutoff)
    after = job(queue, installed, 3, created_at=cutoff + dt.timedelta(seconds=1))
    today = job(queue, installed, 3)
    assert queue.clear_finished_jobs(2) == 2
    assert [state_of(installed, i) for i in (before, at_cutoff, after, today)] == [None, None, 3, 3]


def test_clear_finished_jobs_is_the_queues_own(make_queue, installed):
    mine, other = make_queue(queue="general"), make_queue(queue="other")
    theirs = job(other, installed, 3)
    job(mine, installed, 3)
    assert mine.clear_finished_jobs() == 1
    assert state_of(installed, theirs) == 3


@pytest.mark.parametrize("days", [-1, 1.5, "2", True])
def test_clear_finished_jobs_rejects_bad_days(make_queue, installed, days):
    queue = make_queue()
    kept = job(queue, installed, 3)
    with pytest.raises(ValueError):
        queue.clear_finished_jobs(days)
    assert state_of(installed, kept) == 3


# --- the command lock (no database) ---


def test_checklist_103_lock_is_exclusive_and_released(tmp_path):
    with command_lock("process-x", tmp_path) as held:
        pid, started, _ = (tmp_path / "process-x.lock").read_text().split()
        assert int(pid) == os.getpid() and abs(float(started) - time.time()) < 60
        with pytest.raises(CommandLockedError) as caught:
            command_lock("process-x", tmp_path).acquire()
        assert caught.value.pid == os.getpid()
        with command_lock("process-y", tmp_path):  # another name: independent
            pass
        assert held.held
    with command_lock("process-x", tmp_path):  # released: free again
        pass


def test_checklist_103_a_killed_holders_lock_is_taken_over(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import signal
                from pathlib import Path
                from bgq.cli.cmdlock import command_lock
                with command_lock("stale", Path({str(tmp_path)!r})):
                    print("held", flush=True)
                    signal.pause()  # held until the test kills it
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CommandLockedError) as caught:
            command_lock("stale", tmp_path).acquire()
        assert caught.value.pid == holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert (tmp_path / "stale.lock").read_text().split()[0] == str(holder.pid)  # the dead pid stays
    with command_lock("stale", tmp_path):
        assert (tmp_path / "stale.lock").read_text().split()[0] == str(os.getpid())


def test_locks_dir_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("BGQ_LOCKS_DIR", str(tmp_path / "here"))
    assert locks_dir() == tmp_path / "here"
    with command_lock("monitor-q"):
        assert (tmp_path / "here" / "monitor-q.lock").exists()
    monkeypatch.delenv("BGQ_LOCKS_DIR")
    assert locks_dir().parts[-3:] == (".cache", "bgq", "locks")


@pytest.mark.parametrize("name", ["", "a/b", "../x", ".hidden", "sp ace"])
def test_lock_names_are_plain(tmp_path, name):
    with pytest.raises(ValueError):
        command_lock(name, tmp_path)


def test_lock_names_differ_by_table_queue_and_database():
    names = {
        lock_name("process", "t1", "general", "mysql+pymysql://h/db1"),
        lock_name("process", "t2", "general", "mysql+pymysql://h/db1"),
        lock_name("process", "t1", "other", "mysql+pymysql://h/db1"),
        lock_name("process", "t1", "general", "mysql+pymysql://h/db2"),
        lock_name("monitor", "t1", "general", "mysql+pymysql://h/db1"),
    }
    assert len(names) == 5
    long = lock_name("process", "t" * 40, "q" * 255, "postgresql+psycopg://user:secret@h/db")
    assert len(long) < 200 and "secret" not in long
    command_lock(long)  # a valid file name


# --- the commands, as a person runs them ---


@pytest.fixture
def cli(tmp_path, installed):
    """Run `bgq --app <module>:queue ARGS` on the installed table, with a locks dir of the test's own."""
    module = write_app(tmp_path, installed.url, installed.table)
    locks = tmp_path / "locks"

    def run(*args: str, app: str = module, timeout: float = 120):
        env = {"BGQ_LOCKS_DIR": str(locks)}
        return bgq("--app", f"{app}:queue", *args, pythonpath=tmp_path, env=env, timeout=timeout)

    run.module = module
    run.locks = locks
    return run


def app_queue(installed, queue="general") -> Queue:
    """A Queue configured like write_app's (for lock names and publishing)."""
    return Queue(
        callbacks={"touch": lambda name: None, "noop": lambda: None},
        database_url=installed.url,
        table_name=installed.table,
        queue=queue,
    )


def test_checklist_90_monitor_prints_one_line_per_state(cli, make_queue, installed):
    queue = make_queue()
    job(queue, installed, 4, created_at=OLD + dt.timedelta(days=1))
    job(queue, installed, 4, created_at=OLD)
    job(queue, installed, 2, last_attempt_at=OLD + dt.timedelta(days=2), updated_at=dt.datetime.now(UTC))
    result = cli("monitor")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "TEMPORARILY_FAILED (4): 2 (oldest 2024-05-01 10:00:00 UTC)",
        "PERMANENTLY_FAILED (5): 0",
        "PROCESSING > 24h (2): 1 (oldest 2024-05-03 10:00:00 UTC)",
    ]
    assert "CRITICAL bgq: Stuck jobs report: 2x TEMPORARILY_FAILED" in result.stderr


def test_checklist_90_monitor_with_nothing_stuck(cli, installed):
    result = cli("monitor")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "TEMPORARILY_FAILED (4): 0",
        "PERMANENTLY_FAILED (5): 0",
        "PROCESSING > 24h (2): 0",
    ]
    assert result.stderr == ""


def test_checklist_90_monitor_json(cli, make_queue, installed):
    queue = make_queue()
    job(queue, installed, 5, created_at=OLD)
    result = cli("monitor", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "temporarily_failed": {"state": 4, "count": 0, "oldest_since": None},
        "permanently_failed": {"state": 5, "count": 1, "oldest_since": "2024-05-01T10:00:00.250000+00:00"},
        "processing_over_24h": {"state": 2, "count": 0, "oldest_since": None},
        "paused": [],
        "process_lock": None,
    }


def test_checklist_91_clear_finished_command(cli, make_queue, installed):
    queue = make_queue()
    old = job(queue, installed, 3, created_at=midnight() - dt.timedelta(days=1, seconds=1))
    recent = job(queue, installed, 3, created_at=midnight() - dt.timedelta(hours=1))
    today = job(queue, installed, 3)
    redundant = job(queue, installed, 7, created_at=OLD)

    result = cli("clear-finished")  # default: 1 day
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "deleted 1 finished job(s)"
    assert [state_of(installed, i) for i in (old, recent, today, redundant)] == [None, 3, 3, 7]

    result = cli("clear-finished", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "deleted 2 finished job(s)"
    assert state_of(installed, redundant) == 7


@pytest.mark.parametrize("days", ["740000", "100000000"])
def test_clear_finished_with_more_days_than_the_calendar_holds_deletes_nothing(
    cli, make_queue, installed, days
):
    """A cutoff before the year 1 is no error (no job is that old), not an OverflowError traceback."""
    kept = job(make_queue(), installed, 3, created_at=OLD)
    result = cli("clear-finished", days)
    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, "deleted 0 finished job(s)", "")
    assert state_of(installed, kept) == 3


@pytest.mark.parametrize("bad", ["abc", "-1", "1.5"])
def test_checklist_91_clear_finished_rejects_a_bad_number_of_days(cli, make_queue, installed, bad):
    kept = job(make_queue(), installed, 3, created_at=OLD)
    result = cli("clear-finished", bad)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert state_of(installed, kept) == 3


def test_checklist_103_process_exits_0_at_once_while_another_process_runs(cli, installed, tmp_path):
    queue = app_queue(installed)
    try:
        job_id = queue.publish("touch", ["locked-mark"])
        with command_lock(queue_lock_name("process", queue), cli.locks):
            started = time.monotonic()
            result = cli("process")
            assert result.returncode == 0, result.stderr
            assert time.monotonic() - started < 60
            assert "is already running on this host; exiting." in result.stderr
            assert result.stderr.startswith("bgq: process-")
            assert result.stdout == ""
            assert state_of(installed, job_id) == JobState.READY
            assert not (tmp_path / "locked-mark").exists()
        result = cli("process")  # released: it runs
        assert result.returncode == 0, result.stderr
        assert "already running" not in result.stderr
        assert state_of(installed, job_id) == JobState.FINISHED
        assert (tmp_path / "locked-mark").read_text() == "done"
    finally:
        queue.close()


def test_checklist_103_a_killed_process_command_does_not_block_the_next(cli, installed, tmp_path):
    """The lock of a `bgq process` killed mid-run (SIGKILL) is taken over by the next run."""
    queue = app_queue(installed)
    name = queue_lock_name("process", queue)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import signal; from pathlib import Path; from bgq.cli.cmdlock import command_lock\n"
            f"with command_lock({name!r}, Path({str(cli.locks)!r})):\n"
            f"    print('held', flush=True); signal.pause()\n",  # held until the test kills it
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        job_id = queue.publish("touch", ["after-kill"])
        assert holder.stdout.readline().strip() == "held"
        assert "already running" in cli("process").stderr
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        result = cli("process")
        assert result.returncode == 0, result.stderr
        assert "already running" not in result.stderr
        assert state_of(installed, job_id) == JobState.FINISHED
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)
        queue.close()


@pytest.mark.parametrize(
    ("command", "args"),
    [("monitor", ()), ("clear-finished", ("0",)), ("install-procs", ())],
)
def test_checklist_103_locked_commands_exit_0_at_once(cli, make_queue, installed, command, args):
    queue = app_queue(installed)
    finished = job(make_queue(), installed, 3)
    try:
        if command == "install-procs":
            name = lock_name(command, installed.table, _key(queue))
        else:
            name = queue_lock_name(command, queue)
        with command_lock(name, cli.locks):
            result = cli(command, *args)
        assert result.returncode == 0, result.stderr
        assert result.stdout == ""
        assert result.stderr == f"bgq: {name} is already running on this host; exiting.\n"
        assert state_of(installed, finished) == 3  # clear-finished deleted nothing
        result = cli(command, *args)
        assert result.returncode == 0, result.stderr
        assert result.stdout != ""
    finally:
        queue.close()


def _key(queue: Queue) -> str:
    from bgq.cli.commands import _database_key

    return _database_key(queue.config.database_url, queue.config.data_dir)


def test_checklist_103_reload_consumers_is_locked(cli, installed, tmp_path):
    """Locked before it talks to the broker (an unreachable one here: it is never contacted)."""
    module = "bgq_reload_app"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            f"""
            import bgq
            from bgq.broker.rabbitmq import RabbitMQ

            queue = bgq.Queue(
                callbacks={{"noop": lambda: None}},
                database_url={installed.url!r},
                table_name={installed.table!r},
                queue="general",
                producer=RabbitMQ("amqp://guest:guest@127.0.0.1:1/"),
            )
            """
        )
    )
    queue = app_queue(installed)
    try:
        with command_lock(queue_lock_name("reload-consumers", queue), cli.locks):
            result = cli("reload-consumers", "3", app=module)
        assert result.returncode == 0, result.stderr
        assert "is already running on this host; exiting." in result.stderr
        result = cli("reload-consumers", "3", app=module, timeout=60)  # unlocked: tries the broker
        assert result.returncode != 0
    finally:
        queue.close()


def test_checklist_103_other_queues_and_commands_are_not_blocked(cli, installed, tmp_path):
    """The lock is per command and per queue/table/database: other apps on the host run."""
    other_module = write_app(tmp_path, installed.url, installed.table)
    (tmp_path / f"{other_module}.py").write_text(
        (tmp_path / f"{other_module}.py").read_text().replace('queue="general"', 'queue="other"')
    )
    queue = app_queue(installed)
    try:
        with command_lock(queue_lock_name("process", queue), cli.locks):
            other = cli("process", app=other_module)
            monitor = cli("monitor")
        assert other.returncode == 0 and "already running" not in other.stderr, other.stderr
        assert "nothing due" in other.stdout
        assert monitor.returncode == 0 and "already running" not in monitor.stderr, monitor.stderr
    finally:
        queue.close()
