"""The worker registry (bgq/modes/registry.py), `bgq workers`, and the dead-worker reap end to end."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket

import pytest

from bgq import JobState
from bgq.errors import ConfigError
from bgq.jobs.reaper import REAP_INTERVAL
from bgq.model import WorkerMode, WorkerRow
from bgq.modes.registry import Registry, version
from tests.support.cli import run_bgq
from tests.support.helpers import state_of, wait_until
from tests.support.work_app import ROOT
from tests.test_work import cli  # noqa: F401  (the fixture)


def _rows(installed) -> list[dict]:
    return installed.sql("SELECT * FROM {t}_worker ORDER BY id")


def test_the_dead_bound_must_exceed_two_heartbeats(make_queue):
    with pytest.raises(ConfigError, match="worker_dead_after"):
        make_queue(worker_heartbeat_interval=5, worker_dead_after=10)
    with pytest.raises(ConfigError, match="worker_heartbeat_interval"):
        make_queue(worker_heartbeat_interval=0)
    with pytest.raises(ConfigError, match="log_format"):
        make_queue(log_format="xml")
    assert make_queue(worker_heartbeat_interval=5, worker_dead_after=0).config.worker_dead_after == 0


def test_registry_registers_heartbeats_and_deregisters(make_queue, installed):
    queue = make_queue(worker_heartbeat_interval=1, worker_dead_after=3)
    registry = Registry(queue, WorkerMode.WORK, "general")
    with registry:
        worker_id = registry.id
        assert worker_id is not None and queue.executor.worker_id == worker_id
        (row,) = _rows(installed)
        assert (row["id"], row["host"], row["pid"], row["mode"], row["queue"], row["version"]) == (
            worker_id, socket.gethostname(), os.getpid(), "work", "general", version(),
        )  # fmt: skip
        first_beat = row["last_heartbeat_at"]
        queue.executor.current_job_id, queue.executor.jobs_done = 12345, 7
        wait_until(lambda: _rows(installed)[0]["jobs_done"] == 7, "the thread's heartbeat", 5)
        (row,) = _rows(installed)
        assert row["current_job_id"] == 12345 and row["last_heartbeat_at"] > first_beat
        (listed,) = queue.workers()
        assert isinstance(listed, WorkerRow) and listed.id == worker_id and listed.jobs_done == 7
        assert listed.started_at.tzinfo is not None
        queue.executor.current_job_id = None
        # An outer registration makes an inner one a no-op (cron's pass inside `bgq process`).
        with Registry(queue, WorkerMode.PROCESS, "general") as inner:
            assert inner.id is None and len(_rows(installed)) == 1
        assert queue.executor.worker_id == worker_id
    assert _rows(installed) == []
    assert queue.executor.worker_id is None


def test_a_worker_whose_row_was_reaped_registers_again(make_queue, installed, caplog):
    queue = make_queue(worker_heartbeat_interval=60, worker_dead_after=180)  # the test beats by hand
    registry = Registry(queue, WorkerMode.CONSUME, "general")
    with registry:
        old = registry.id
        later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
        assert queue.reaper.run_once(later) == []  # no job; the silent worker's row is removed
        assert _rows(installed) == []
        with caplog.at_level("WARNING", logger="bgq"):
            assert registry.beat() is False
        assert "registering again" in caplog.text
        (row,) = _rows(installed)
        assert row["id"] == registry.id != old and queue.executor.worker_id == registry.id
        assert row["mode"] == "consume"
    assert _rows(installed) == []


def test_process_registers_for_its_run_and_counts_its_jobs(make_queue, installed):
    seen = []
    queue = make_queue(callbacks={"look": lambda: seen.append(_rows(installed))})
    job = queue.publish("look")
    assert queue.process().outcomes == {"claimed": 1}
    ((row,),) = seen
    assert (row["mode"], row["current_job_id"]) == ("process", None)  # no beat came during the job
    assert _rows(installed) == []  # removed at the end of the run
    assert state_of(installed, job) == JobState.FINISHED
    assert queue.executor.jobs_done == 1


def test_bgq_workers_lists_a_running_bgq_work_and_forgets_it_after_sigterm(installed, cli):  # noqa: F811
    runner = cli()
    proc = runner.start("work", "-c", "2")
    wait_until(lambda: len(_rows(installed)) == 2, "two registered workers", 30, step=0.2)
    env = {**runner.bgq_env, "BGQ_APP": "tests.support.work_app:queue"}
    listed = run_bgq("workers", "--json", cwd=ROOT, env=env)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert sorted(r["mode"] for r in rows) == ["work", "work"]
    assert {r["host"] for r in rows} == {socket.gethostname()}
    assert len({r["pid"] for r in rows}) == 2 and proc.pid not in {r["pid"] for r in rows}  # the forks
    assert all(r["dead"] is False and r["heartbeat_age_s"] < 30 and r["jobs_done"] == 0 for r in rows)
    text = run_bgq("workers", cwd=ROOT, env=env)
    assert text.returncode == 0 and text.stdout.splitlines()[0].startswith("ID\tHOST\tPID\tMODE")
    assert len(text.stdout.splitlines()) == 3
    code, _ = runner.terminate(proc, timeout=20)
    assert code == 0, runner.output(proc)
    assert _rows(installed) == []


BEAT, DEAD = 1, 3
#: The reaper's longest pause between passes, a heartbeat interval and a second for the pass.
REAP_SLACK = 1.5 * REAP_INTERVAL + BEAT + 1.0


def _a_slow_grouped_job_running(cli, make_queue):  # noqa: F811
    """Two `bgq work` processes (stalled_job_timeout an hour, worker heartbeat BEAT, dead after
    DEAD) and group g0: a slow first job, started, and three after it. (runner, queue, slow job,
    the other jobs, {pid: process}, the pid running the slow job)."""
    runner = cli(stalled=3600)
    runner.env.update(BGQ_TEST_WORK_BEAT=str(BEAT), BGQ_TEST_WORK_DEAD_AFTER=str(DEAD))
    queue = make_queue(callbacks={"slow_once": print, "ledger": print}, priorities=[1, 2, 3])
    slow = queue.publish("slow_once", ["slow", "g0"], serial_group="g0", priority=1)
    rest = [queue.publish("ledger", [f"k{n}", "g0"], serial_group="g0", priority=2) for n in range(3)]
    procs = {p.pid: p for p in (runner.start("work"), runner.start("work"))}
    start = wait_until(
        lambda: next((e for e in runner.events() if e["token"] == "slow"), None), "the slow job to start", 30
    )
    return runner, queue, slow, rest, procs, start["pid"]


@pytest.mark.slow
def test_a_sigkilled_bgq_work_s_job_is_reaped_within_the_worker_bound(installed, cli, make_queue):  # noqa: F811
    """Two `bgq work` processes; the one running a grouped job is SIGKILLed mid-job: the other
    reaps the job within worker_dead_after + REAP_SLACK of the victim's last heartbeat (with
    stalled_job_timeout at an hour, so only the dead-worker reap can do it), the victim's row is
    removed, and the group goes on. The claim stores its worker's id (p_worker_id), which is what
    the dead-worker reap reads.
    """
    runner, queue, slow, rest, procs, victim = _a_slow_grouped_job_running(cli, make_queue)
    (worker,) = [r for r in _rows(installed) if r["pid"] == victim]
    (job,) = installed.sql("SELECT worker_id FROM {t} WHERE id = %s", (slow,))
    assert job["worker_id"] == worker["id"], "the claim did not store its worker's id"
    last_beat = worker["last_heartbeat_at"]  # the victim may beat once more (BEAT s) before the kill
    os.kill(victim, signal.SIGKILL)
    procs[victim].wait(10)
    (survivor,) = set(procs) - {victim}

    wait_until(lambda: state_of(installed, slow) != JobState.PROCESSING, "the reap", DEAD + REAP_SLACK + 10)
    (row,) = installed.sql("SELECT state, error_message, updated_at FROM {t} WHERE id = %s", (slow,))
    delay = (row["updated_at"] - last_beat) / dt.timedelta(seconds=1)
    print(
        f"\n{installed.db.dialect.name}: the dead worker's job was reaped {delay:.2f} s after its heartbeat"
    )
    assert row["state"] == JobState.TEMPORARILY_FAILED
    assert f"its worker {worker['id']} stopped heartbeating" in row["error_message"]
    assert delay <= DEAD + REAP_SLACK, f"reaped {delay:.1f} s after the last heartbeat read"
    assert all(r["pid"] != victim for r in _rows(installed))  # the dead worker's row is gone
    installed.sql("UPDATE {t} SET postponed_by = 0 WHERE id = %s AND state = 4", (slow,))  # backoff over
    wait_until(
        lambda: all(state_of(installed, j) == JobState.FINISHED for j in [slow, *rest]), "the group", 30
    )
    code, _ = runner.terminate(procs[survivor], timeout=15)
    assert code == 0
    assert f"bgq: Dead worker's job reaped. (ID: {slow}, PID {victim})" in runner.output(procs[survivor])


@pytest.mark.slow
def test_a_cancelled_job_whose_bgq_work_was_sigkilled_stays_cancelled_and_its_group_goes_on(
    installed,
    cli,  # noqa: F811
    make_queue,
):
    """A running job's cancel reaches it at its next heartbeat; the slow job sends none, and its
    `bgq work` is SIGKILLed first. The other worker's reaper records the job REDUNDANT with the
    cancel's reason instead of retrying it, and the rest of the group runs; the cancelled job
    started once (the ledger, written by the callbacks, is the judge)."""
    runner, queue, slow, rest, procs, victim = _a_slow_grouped_job_running(cli, make_queue)
    assert queue.cancel(slow, "operator stop").outcome == "abort_requested"
    os.kill(victim, signal.SIGKILL)
    procs[victim].wait(10)
    (survivor,) = set(procs) - {victim}

    wait_until(
        lambda: all(state_of(installed, j) == JobState.FINISHED for j in rest),
        "the group",
        DEAD + REAP_SLACK + 30,
    )
    (row,) = installed.sql("SELECT state, error_message, finished_at FROM {t} WHERE id = %s", (slow,))
    assert (row["state"], row["error_message"]) == (JobState.REDUNDANT, "Cancelled: operator stop")
    assert row["finished_at"] is not None
    starts = [e["token"] for e in runner.events() if e["event"] == "start"]
    assert sorted(starts) == ["k0", "k1", "k2", "slow"], starts  # the cancelled job did not run again
    code, _ = runner.terminate(procs[survivor], timeout=15)
    assert code == 0
    assert f"it had been cancelled, so it stays cancelled. (ID: {slow}, PID {victim})" in runner.output(
        procs[survivor]
    )
