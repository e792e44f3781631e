"""`bgq work -c N`'s supervisor, with real processes: stop means stop, restarts, crash loops."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bgq.cli import supervisor
from tests.support.helpers import wait_until
from tests.support.work_app import Cli
from tests.test_work import cli  # noqa: F401  (the fixture)


def children(pid: int) -> set[int]:
    """The live (not zombie) child processes of `pid`, read from /proc."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if fields[0] != "Z" and int(fields[1]) == pid:
            found.add(int(entry.name))
    return found


def group_is_empty(pgid: int) -> bool:
    """No process is left in the process group (the parent and every child it forked)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def start_supervisor(runner: Cli, count: int = 2) -> tuple[subprocess.Popen[bytes], set[int]]:
    proc = runner.start("work", "-c", str(count), "--poll", "0.1")

    def all_up() -> set[int] | None:
        found = children(proc.pid)
        return found if len(found) == count else None

    return proc, wait_until(all_up, f"{count} workers", 30)


@pytest.mark.slow
def test_sigterm_during_the_restart_pause_stops_everything_at_once(cli):  # noqa: F811
    """A worker is SIGKILLed; while the supervisor waits to start it again, SIGTERM arrives: it
    starts nothing more, stops the other worker and exits promptly, leaving no process behind."""
    runner = cli()
    proc, pids = start_supervisor(runner)
    victim = min(pids)
    os.kill(victim, signal.SIGKILL)
    # Reaped (gone from /proc) means the supervisor saw the death and is in its restart pause.
    wait_until(lambda: not Path(f"/proc/{victim}").exists(), "the killed worker to be reaped", 10, 0.002)
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    code = runner.wait_exit(proc, 15)
    took = time.monotonic() - started
    assert code == 0, runner.output(proc)
    wait_until(lambda: group_is_empty(proc.pid), "every worker process to be gone", 10)
    assert took < 10, f"the stop took {took:.1f} s"


@pytest.mark.slow
def test_workers_of_a_sigkilled_supervisor_stop_instead_of_running_on_as_orphans(cli):  # noqa: F811
    """The supervisor is SIGKILLed (nothing can forward a stop): each worker sees it is gone and
    stops as on SIGTERM within about supervisor.PARENT_CHECK seconds, with exit 0 and a line
    saying why; a restarted supervisor never runs beside orphans."""
    runner = cli()
    proc, pids = start_supervisor(runner)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    started = time.monotonic()
    wait_until(
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), "the orphaned workers to stop", 15
    )
    took = time.monotonic() - started
    output = runner.output(proc)
    for pid in pids:
        assert f"bgq: worker {pid}: its supervisor (pid {proc.pid}) is gone; stopping." in output, output
    assert took < supervisor.PARENT_CHECK + 5, f"the workers stopped {took:.1f} s after their supervisor"


@pytest.mark.slow
def test_a_sigkilled_worker_is_restarted_and_sigterm_then_stops_all(cli):  # noqa: F811
    runner = cli()
    proc, pids = start_supervisor(runner)
    victim = min(pids)
    os.kill(victim, signal.SIGKILL)

    def replaced() -> set[int] | None:
        found = children(proc.pid)
        return found if len(found) == 2 and victim not in found else None

    now = wait_until(replaced, "the killed worker to be replaced", 30)
    assert len(now & pids) == 1, "the other worker kept running"
    assert proc.poll() is None
    code, _ = runner.terminate(proc, timeout=15)
    assert code == 0, runner.output(proc)
    wait_until(lambda: group_is_empty(proc.pid), "every worker process to be gone", 10)


@pytest.mark.slow
@pytest.mark.parametrize("dialect", ["postgres"], indirect=True)
def test_workers_that_crash_at_start_make_the_supervisor_give_up(cli, dialect):  # noqa: F811
    """Each forked worker dies at its start (it cannot connect): the supervisor backs off,
    then gives up after CRASH_LIMIT crashes in a row with one clear line and exit code 1. The
    crash loop is the same on both dialects, so one shows it (its backoff takes ~8 s)."""
    runner = cli()
    proc = runner.start("work", "-c", "2", app="crashing_queue")
    code = runner.wait_exit(proc, 90)
    output = runner.output(proc)
    assert code == 1, output
    lines = output.strip().splitlines()
    give_up = (
        f"bgq: a bgq work process died within {supervisor.CRASH_WINDOW:g} s of its start "
        f"{supervisor.CRASH_LIMIT} times in a row (last exit code 1); giving up: see its output above."
    )
    assert lines[-1] == give_up, output
    assert lines.count(give_up) == 1
    crashes = output.count("RuntimeError: tests.support.work_app:crashing_queue: this worker cannot start")
    assert supervisor.CRASH_LIMIT <= crashes <= 2 * supervisor.CRASH_LIMIT, output
    assert group_is_empty(proc.pid)


@pytest.mark.parametrize("dialect", ["mysql"], indirect=True)
def test_a_queue_with_a_broker_is_refused_before_any_worker_starts(cli, dialect, monkeypatch):  # noqa: F811
    """The supervisor checks the queue in its own process: one line and exit 1, not N crash loops."""
    monkeypatch.setenv("BGQ_TEST_WORK_BROKER", "1")
    runner = cli()
    runner.env["BGQ_TEST_WORK_BROKER"] = "1"
    proc = runner.start("work", "-c", "3")
    code = runner.wait_exit(proc, 60)
    assert code == 1
    assert runner.output(proc).splitlines() == [
        "bgq: bgq work runs on the database alone; this queue has a broker: use `bgq consume`."
    ]
