"""Continuous workers reap stalled jobs themselves: no cron needed (bgq/jobs/reaper.py), on both dialects.

A worker is SIGKILLed while it runs a grouped job; nothing but the surviving workers (`bgq work`,
or `bgq consume` with RabbitMQ) runs. The killed job must be reaped within stalled_job_timeout +
REAP_SLACK seconds of its claim, and then the group's remaining jobs all run, in order. The
reaped job's backoff (a minute on its first attempt, SPEC 5.11) is the spec's and is not what is
under test: the test ends it by hand (postponed_by = 0; in broker mode also re-sending the id
the reaper sent to the one-minute delay queue).
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import signal
from collections import Counter

import pytest

import bgq.jobs.executor
from bgq import JobState
from bgq.jobs.reaper import REAP_INTERVAL
from tests.conftest import AMQP_URL
from tests.support import ledger_worker
from tests.support.clock import Clock, FakeTime
from tests.support.helpers import state_of, wait_state_left, wait_until
from tests.test_work import cli  # noqa: F401  (the fixture)
from tests.test_work_concurrency import _check_groups, _publish, _unfinished

pytestmark = pytest.mark.slow

STALLED = 3
#: The reaper's longest pause between passes (REAP_INTERVAL x 1.5) and a second for the pass.
REAP_SLACK = 1.5 * REAP_INTERVAL + 1.0


def _reap_delay(installed, job_id: int) -> float:
    """Seconds from the job's claim (its last sign of life: ledger jobs send no heartbeats) to
    its reaping, both on the server's clock."""
    (row,) = installed.sql(
        "SELECT state, error_message, last_attempt_at, updated_at FROM {t} WHERE id = %s", (job_id,)
    )
    assert row["state"] == JobState.TEMPORARILY_FAILED
    assert row["error_message"].startswith("Job was stalled in the processing state")
    return (row["updated_at"] - row["last_attempt_at"]) / dt.timedelta(seconds=1)


#: How long a killed worker's job may take to come back (reaped without cron).
REAPED_WITHIN = STALLED + REAP_SLACK + 10


def test_bgq_work_alone_reaps_a_killed_worker_s_job_and_its_group_goes_on(make_queue, installed, cli):  # noqa: F811
    runner = cli(stalled=STALLED)
    specs = [("slow", "g0", 1, "slow_once")]
    specs += [(f"k{n}", "g0", 2, "ledger") for n in range(5)]  # behind the slow job in g0
    specs += [(f"j{n}", f"g{1 + n % 2}", 1 + n % 3, "ledger") for n in range(20)]
    jobs = _publish(make_queue, specs)
    procs = {p.pid: p for p in (runner.start("work"), runner.start("work"))}
    first = wait_until(
        lambda: next((e for e in runner.events() if e["token"] == "slow"), None), "the slow job to start", 20
    )
    victim = first["pid"]
    os.kill(victim, signal.SIGKILL)
    procs[victim].wait(10)
    (survivor,) = set(procs) - {victim}
    slow_id = jobs["slow"]["id"]

    wait_state_left(installed, slow_id, JobState.PROCESSING, "the bgq work job reaped", REAPED_WITHIN)
    delay = _reap_delay(installed, slow_id)
    print(f"\n{installed.db.dialect.name}: bgq work reaped the job {delay:.2f} s after its claim")
    assert delay <= STALLED + REAP_SLACK, f"reaped {delay:.1f} s after its claim"
    installed.sql("UPDATE {t} SET postponed_by = 0 WHERE id = %s AND state = 4", (slow_id,))  # backoff over
    wait_until(lambda: _unfinished(installed) == 0, "the group's remaining jobs to finish", 20, step=0.2)
    code, _ = runner.terminate(procs[survivor], timeout=15)
    assert code == 0, runner.output(procs[survivor])
    assert f"bgq: Stalled job reaped. (ID: {slow_id}, PID {victim})" in runner.output(procs[survivor])

    work = [e for e in runner.events() if e["event"] in ("start", "end")]
    assert Counter(e["token"] for e in work if e["event"] == "end") == Counter(jobs.keys())
    _check_groups(work, jobs, killed="slow")


def _consumers(installed, ledger, base: str, count: int) -> list[multiprocessing.process.BaseProcess]:
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(
            target=ledger_worker.consume_ledger,
            args=(installed.url, installed.table, ledger, AMQP_URL, base),
            kwargs={"stalled": STALLED},
        )
        for _ in range(count)
    ]
    for proc in procs:
        proc.start()
    return procs


def test_bgq_consume_alone_reaps_a_killed_consumer_s_job_and_its_group_goes_on(
    broker_queue, rabbit, installed, ledger
):
    queue = broker_queue(
        callbacks={"ledger": ledger_worker.ledger_job, "slow_once": ledger_worker.slow_once_job},
        stalled_job_timeout=STALLED,
    )
    slow_id = queue.publish("slow_once", ["slow", "g0"], serial_group="g0", priority=1)
    rest = [queue.publish("ledger", [f"k{n}", "g0"], serial_group="g0", priority=2) for n in range(3)]
    procs = {p.pid: p for p in _consumers(installed, ledger, rabbit.base, 2)}
    try:
        start = wait_until(
            lambda: next(
                (e for e in ledger_worker.read_ledger(installed.url, ledger) if e[1] == "slow"), None
            ),
            "the slow job to start",
            30,
        )
        (victim,) = installed.sql("SELECT pid FROM {t} WHERE id = %s", (slow_id,))[0].values()
        assert start[3] == "start" and victim in procs
        procs[victim].kill()
        procs[victim].join(10)

        wait_state_left(installed, slow_id, JobState.PROCESSING, "the consumed job reaped", REAPED_WITHIN)
        delay = _reap_delay(installed, slow_id)
        print(f"\n{installed.db.dialect.name}: bgq consume reaped the job {delay:.2f} s after its claim")
        assert delay <= STALLED + REAP_SLACK, f"reaped {delay:.1f} s after its claim"
        # The reaper sent the id to the one-minute delay queue (its backoff); end the backoff.
        installed.sql("UPDATE {t} SET postponed_by = 0 WHERE id = %s AND state = 4", (slow_id,))
        queue.config.producer.publish(slow_id, rabbit.base, 1, None)
        wait_until(
            lambda: all(state_of(installed, i) == JobState.FINISHED for i in [slow_id, *rest]),
            "the group's remaining jobs to finish",
            20,
            step=0.2,
        )
    finally:
        for proc in procs.values():
            if proc.is_alive():
                proc.terminate()
                proc.join(30)
    starts = [
        token for _, token, _, event in ledger_worker.read_ledger(installed.url, ledger) if event == "start"
    ]
    assert starts == ["slow", "slow", "k0", "k1", "k2"]


def test_run_once_reaps_and_logs_as_process_did(make_queue, installed, caplog):
    """The component on its own: run_once(now) reaps the stalled job and logs it at critical."""
    queue = make_queue(stalled_job_timeout=60)
    job = queue.publish("noop")
    with installed.db.transaction() as conn:
        claim = queue.procs.claim(conn, job, "general", 777, 1000, None)
    assert claim.outcome == "claimed"
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    with caplog.at_level("CRITICAL", logger="bgq"):
        reaped = queue.reaper.run_once(later)
    assert [(r.id, r.pid) for r in reaped] == [(job, 777)]
    assert f"bgq: Stalled job reaped. (ID: {job}, PID 777)" in caplog.text
    assert queue.reaper.run_once(later) == []
    assert make_queue(stalled_job_timeout=0).reaper.run_once(later) == []


@pytest.mark.parametrize(("backoff", "postponed_ms"), [(None, 60_000), (0, 0), (7, 7000)])
def test_stalled_job_backoff_is_the_reaped_jobs_wait(make_queue, installed, backoff, postponed_ms):
    """Queue(stalled_job_backoff=S): a reaped job may run again after S seconds (None: the retry
    backoff, 1 minute after one attempt), and with 0 it is claimable at once."""
    queue = make_queue(stalled_job_timeout=60, stalled_job_backoff=backoff)
    job = queue.publish("noop")
    with installed.db.transaction() as conn:
        assert queue.procs.claim(conn, job, "general", 777, 1000, None).outcome == "claimed"
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    assert [r.id for r in queue.reaper.run_once(later)] == [job]
    row = installed.sql("SELECT state, postponed_by FROM {t} WHERE id = %s", (job,))[0]
    assert (row["state"], row["postponed_by"]) == (4, postponed_ms)
    if backoff == 0:
        assert queue.process().outcomes == {"claimed": 1}


def test_a_consumer_held_up_between_claim_and_start_does_not_run_a_job_taken_over(
    make_queue, installed, monkeypatch
):
    """Found by the chaos harness (full preset, broker mode, MariaDB): a `bgq consume` process
    SIGSTOPped after its claim was acknowledged, for longer than stalled_job_timeout, started the
    callback on SIGCONT although the reaper had given the job to another worker, which had run it
    already: the job ran twice. A claim older than half of stalled_job_timeout is now checked by a
    fenced heartbeat before the callback starts (Executor.still_ours, shared with `bgq work`)."""
    ran = []
    options = {"stalled_job_timeout": 2, "stalled_job_backoff": 0}
    zombie = make_queue(callbacks={"job": lambda: ran.append("zombie")}, **options)
    owner = make_queue(callbacks={"job": lambda: ran.append("owner")}, **options)
    job = zombie.publish("job")
    frozen = FakeTime()
    monkeypatch.setattr(bgq.jobs.executor, "time", frozen)

    def held_up() -> None:  # what a SIGSTOP after the acknowledgement does: time passes, others move on
        frozen.advance(1.2)  # past half of stalled_job_timeout (time.monotonic() counts a stopped process)
        later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30)
        assert [r.id for r in owner.reaper.run_once(later)] == [job]
        assert owner.process_job(job) == "claimed"

    assert zombie.process_job(job, on_claimed=held_up) == "taken_over"
    assert ran == ["owner"]
    row = installed.sql("SELECT state, number_of_attempts FROM {t} WHERE id = %s", (job,))[0]
    assert (row["state"], row["number_of_attempts"]) == (JobState.FINISHED, 2)


def test_a_registered_worker_held_up_past_the_worker_bound_does_not_run_a_job_taken_over(
    make_queue, installed, monkeypatch
):
    """Found by a newcomer's fault run (PostgreSQL, worker_dead_after 10, stalled_job_timeout at
    its default 3600): a `bgq work` process SIGSTOPped between a claim and its start for longer
    than worker_dead_after had its job taken back by the dead-worker reap and run by another
    worker; on SIGCONT it ran the job again, after later jobs of its group. The late-start check
    only looked at stalled_job_timeout. It now uses the shortest reaping bound, and renews the
    worker's row before the job's fenced heartbeat."""
    ran = []
    options = {
        "stalled_job_timeout": 3600, "worker_dead_after": 3, "worker_heartbeat_interval": 1,
        "stalled_job_backoff": 0,
    }  # fmt: skip
    zombie = make_queue(callbacks={"job": lambda: ran.append("zombie")}, **options)
    owner = make_queue(callbacks={"job": lambda: ran.append("owner")}, **options)
    with zombie.database.transaction() as conn:  # registered, and then frozen: no heartbeat thread
        zombie.executor.worker_id = zombie.procs.worker_register(
            conn, "h", os.getpid(), "work", "general", "t"
        )
    job = zombie.publish("job")
    frozen = FakeTime()
    monkeypatch.setattr(bgq.jobs.executor, "time", frozen)

    def held_up() -> None:  # a SIGSTOP after the claim: the worker's row goes stale, others move on
        frozen.advance(1.7)  # past half of worker_dead_after, far below half of stalled_job_timeout
        later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30)
        assert [r.id for r in owner.reaper.run_once(later)] == [job]
        assert owner.process_job(job) == "claimed"

    assert zombie.process_job(job, on_claimed=held_up) == "taken_over"
    assert ran == ["owner"]
    row = installed.sql("SELECT state, number_of_attempts FROM {t} WHERE id = %s", (job,))[0]
    assert (row["state"], row["number_of_attempts"]) == (JobState.FINISHED, 2)


def test_a_late_claim_that_still_holds_runs_and_is_renewed(make_queue, installed, monkeypatch):
    """The same check lets a late job whose claim nobody took run: its heartbeat is renewed first,
    so the reaper (which would take it at stalled_job_timeout) leaves it alone meanwhile."""
    seen = []

    def look() -> None:
        seen.append(installed.sql("SELECT updated_at, last_attempt_at FROM {t} WHERE id = %s", (job,))[0])

    clock, frozen = Clock(), FakeTime()
    monkeypatch.setattr(bgq.jobs.executor, "time", frozen)
    queue = make_queue(callbacks={"job": look}, stalled_job_timeout=2, clock=clock)
    job = queue.publish("job")
    # 1.2 s late, by bgq's clock and by the worker's monotonic time alike (as a stopped process sees it)
    assert queue.process_job(job, on_claimed=lambda: (clock.advance(1.2), frozen.advance(1.2))) == "claimed"
    (row,) = seen
    assert (row["updated_at"] - row["last_attempt_at"]).total_seconds() >= 1.0  # renewed after the wait
    assert installed.sql("SELECT state FROM {t} WHERE id = %s", (job,))[0]["state"] == JobState.FINISHED
