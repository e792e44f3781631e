"""Heartbeats and the reaper end to end: long jobs under a running reaper, and a worker killed by SIGKILL."""

from __future__ import annotations

import datetime as dt
import logging
import multiprocessing
import os
import signal
import threading
import time

import pytest
import sqlalchemy as sa

from bgq import JobAborted, JobState, Queue, TemporaryErrorException
from tests.support import ledger_worker
from tests.support.clock import Clock
from tests.support.helpers import set_row, unique_name, utc, wait_until

HOURS_AGO_2 = dt.timedelta(hours=2)


def _row(installed, job_id):
    found = installed.sql("SELECT * FROM {t} WHERE id = %s", (job_id,))[0]
    for name in ("created_at", "updated_at", "last_attempt_at", "finished_at"):
        found[name] = utc(found[name])
    return found


def _now(installed) -> dt.datetime:
    """The database server's clock (the one updated_at is written with)."""
    return utc(installed.sql(f"SELECT {installed.db.dialect.now_sql()} AS now")[0]["now"])


def _heartbeat_messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "Heartbeat" in r.getMessage()]


# --- heartbeat() inside and outside a job (checklist 77-80) ---


@pytest.mark.parametrize(("interval", "moves"), [(0, True), (3600, False)])
def test_checklist_77_heartbeat_moves_updated_at_to_now_at_most_once_per_interval(
    make_queue, installed, interval, moves
):
    """SPEC 13.2 #16: interval 0 -> updated_at is about now; interval 3600 -> unchanged (throttled)."""
    seen = {}

    def long_job():
        old = _now(installed) - HOURS_AGO_2
        set_row(installed, ids["job"], updated_at=old)
        queue.heartbeat()
        seen["old"], seen["after"], seen["now"] = (
            old,
            _row(installed, ids["job"])["updated_at"],
            _now(installed),
        )

    queue = make_queue(callbacks={"long": long_job}, heartbeat_interval=interval)
    ids = {"job": queue.publish("long")}
    assert queue.process_job(ids["job"]) == "claimed"
    if moves:
        assert seen["now"] - dt.timedelta(seconds=60) < seen["after"] <= seen["now"]
    else:
        assert seen["after"] == seen["old"]
    assert _row(installed, ids["job"])["state"] == JobState.FINISHED


def test_checklist_77_interval_0_writes_on_every_call(make_queue, installed, monkeypatch):
    def beats():
        for _ in range(3):
            queue.heartbeat()

    queue = make_queue(callbacks={"beats": beats}, heartbeat_interval=0)
    writes = _count_writes(queue, monkeypatch)
    queue.process_job(queue.publish("beats"))
    assert writes == [1, 1, 1]


def test_checklist_78_heartbeat_outside_a_job_changes_nothing(make_queue, installed, caplog):
    """SPEC 13.2 #18: before any job, and after one, heartbeat() neither writes nor logs."""
    caplog.set_level(logging.DEBUG, logger="bgq")
    unreachable = Queue(database_url="mysql+pymysql://nobody@127.0.0.1:1/none", callbacks={"x": print})
    unreachable.heartbeat()  # no job: it does not even connect

    queue = make_queue(heartbeat_interval=0)
    job = queue.publish("noop")
    queue.heartbeat()
    assert queue.process_job(job) == "claimed"
    old = _now(installed) - HOURS_AGO_2
    set_row(installed, job, state=2, updated_at=old)  # the row looks PROCESSING again, under this claim
    queue.heartbeat()
    assert (_row(installed, job)["state"], _row(installed, job)["updated_at"]) == (2, old)
    assert _heartbeat_messages(caplog) == []


def test_checklist_79_heartbeat_never_touches_a_row_that_is_no_longer_processing(
    make_queue, installed, caplog
):
    """The row is set FINISHED behind the worker's back: the heartbeat changes nothing, warns once,
    and the worker's own finish is fenced out too."""
    caplog.set_level(logging.WARNING, logger="bgq")
    seen = {}

    def job():
        old = _now(installed) - HOURS_AGO_2
        set_row(installed, ids["job"], state=3, updated_at=old, error_message="finished by a person")
        for _ in range(2):  # each call raises JobAborted (the job is no longer this worker's)
            with pytest.raises(JobAborted):
                queue.heartbeat()
        seen["old"], seen["row"] = old, _row(installed, ids["job"])

    queue = make_queue(callbacks={"job": job}, heartbeat_interval=0)
    ids = {"job": queue.publish("job")}
    assert queue.process_job(ids["job"]) == "claimed"
    assert (seen["row"]["state"], seen["row"]["updated_at"]) == (3, seen["old"])
    after = _row(installed, ids["job"])
    assert (after["state"], after["updated_at"], after["error_message"]) == (
        3, seen["old"], "finished by a person",
    )  # fmt: skip
    lost = [m for m in _heartbeat_messages(caplog) if "no longer PROCESSING" in m]
    assert len(lost) == 1 and lost[0].endswith(f"(ID: {ids['job']})")  # once, for two calls
    assert any("taken over" in r.getMessage() for r in caplog.records)


def test_checklist_79_an_old_claim_cannot_keep_a_reclaimed_job_alive(make_queue, installed):
    """The job was reaped and claimed again (attempt 2) while this worker still ran attempt 1."""
    seen = {}

    def job():
        old = _now(installed) - HOURS_AGO_2
        set_row(installed, ids["job"], number_of_attempts=2, updated_at=old)  # the new owner's claim
        with pytest.raises(JobAborted):
            queue.heartbeat()
        seen["old"], seen["row"] = old, _row(installed, ids["job"])

    queue = make_queue(callbacks={"job": job}, heartbeat_interval=0)
    ids = {"job": queue.publish("job")}
    queue.process_job(ids["job"])
    assert (seen["row"]["state"], seen["row"]["updated_at"]) == (2, seen["old"])
    after = _row(installed, ids["job"])
    assert (after["state"], after["number_of_attempts"]) == (2, 2)  # the finish was fenced out too


def test_checklist_80_a_failing_heartbeat_is_logged_and_the_callback_goes_on(
    make_queue, installed, caplog, monkeypatch
):
    caplog.set_level(logging.WARNING, logger="bgq")
    steps = []

    def job():
        steps.append("before")
        queue.heartbeat()
        steps.append("after")

    def broken(*args, **kwargs):
        raise RuntimeError("database on fire")

    queue = make_queue(callbacks={"job": job}, heartbeat_interval=0)
    monkeypatch.setattr(queue.procs, "beat", broken)  # the heartbeat's call (procs.heartbeat + abort)
    job_id = queue.publish("job")
    assert queue.process_job(job_id) == "claimed"
    assert steps == ["before", "after"]
    assert _row(installed, job_id)["state"] == JobState.FINISHED
    (record,) = [r for r in caplog.records if "Heartbeat failed" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == f"bgq: Heartbeat failed (ID: {job_id})."
    assert isinstance(record.exc_info[1], RuntimeError)


def test_checklist_80_an_unreachable_database_is_logged_too(make_queue, installed, caplog):
    """A real driver error (bgq's engine points at a closed port mid-job) is swallowed as well."""
    caplog.set_level(logging.WARNING, logger="bgq")
    steps = []

    def job():
        good = queue.database.engine
        queue.database.engine = sa.create_engine("mysql+pymysql://nobody@127.0.0.1:1/none")
        try:
            queue.heartbeat()
        finally:
            queue.database.engine.dispose()
            queue.database.engine = good
        steps.append("went on")

    queue = make_queue(callbacks={"job": job}, heartbeat_interval=0)
    job_id = queue.publish("job")
    queue.process_job(job_id)
    assert steps == ["went on"]
    assert _row(installed, job_id)["state"] == JobState.FINISHED
    assert [m for m in _heartbeat_messages(caplog)] == [f"bgq: Heartbeat failed (ID: {job_id})."]


# --- the automatic heartbeat from the application's engine (checklist 81) ---


def _count_writes(queue, monkeypatch) -> list[int]:
    """Record each heartbeat write (1 = alive) while still writing it."""
    writes: list[int] = []
    real = queue.procs.beat

    def counting(*args, **kwargs):
        answer = real(*args, **kwargs)
        writes.append(int(answer.alive))
        return answer

    monkeypatch.setattr(queue.procs, "beat", counting)
    return writes


@pytest.fixture
def app_engine(installed):
    engine = sa.create_engine(installed.url)
    yield engine
    engine.dispose()


def _app_query(engine) -> None:
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1").all()


def test_checklist_81_an_app_query_in_the_callback_sends_the_heartbeat(make_queue, installed, app_engine):
    """SPEC 13.2 #17: with the hook on the application's engine, SELECT 1 moves updated_at."""
    seen = {}

    def job():
        old = _now(installed) - HOURS_AGO_2
        set_row(installed, ids["job"], updated_at=old)
        seen["before"] = _row(installed, ids["job"])["updated_at"]
        _app_query(app_engine)
        seen["after"], seen["now"] = _row(installed, ids["job"])["updated_at"], _now(installed)

    queue = make_queue(callbacks={"job": job}, heartbeat_interval=0)
    queue.install_heartbeat(app_engine)
    ids = {"job": queue.publish("job")}
    queue.process_job(ids["job"])
    assert seen["before"] < seen["now"] - dt.timedelta(hours=1)  # nothing moved it on its own
    assert seen["now"] - dt.timedelta(seconds=60) < seen["after"] <= seen["now"]
    assert _row(installed, ids["job"])["state"] == JobState.FINISHED


def test_checklist_81_the_hook_is_throttled_and_a_no_op_outside_a_job(
    make_queue, installed, app_engine, monkeypatch
):
    def job():
        for _ in range(5):
            _app_query(app_engine)

    throttled = make_queue(callbacks={"job": job}, heartbeat_interval=3600)
    throttled.install_heartbeat(app_engine)
    throttled_writes = _count_writes(throttled, monkeypatch)
    _app_query(app_engine)  # outside a job
    throttled.process_job(throttled.publish("job"))
    throttled.close()
    assert throttled_writes == []  # 5 statements, all within the first interval after the claim

    queue = make_queue(callbacks={"job": job}, heartbeat_interval=0)
    remove = queue.install_heartbeat(app_engine)
    queue.install_heartbeat(app_engine)  # a second install adds no second hook
    writes = _count_writes(queue, monkeypatch)
    _app_query(app_engine)  # outside a job
    assert writes == []
    queue.process_job(queue.publish("job"))
    assert writes == [1] * 5  # one per statement, not two
    remove()
    queue.process_job(queue.publish("job"))
    assert writes == [1] * 5  # removed: no more heartbeats


def test_checklist_81_the_hook_on_bgqs_own_engine_does_not_recurse(make_queue, installed, monkeypatch):
    """The guard: a heartbeat's own statement (and every bgq statement) would call heartbeat() again."""
    queue = make_queue(callbacks={"job": lambda: queue.heartbeat()}, heartbeat_interval=0)
    queue.install_heartbeat(queue.database.engine)
    writes = _count_writes(queue, monkeypatch)
    job = queue.publish("job")
    assert queue.process_job(job) == "claimed"
    assert writes == [1]
    assert _row(installed, job)["state"] == JobState.FINISHED


# --- a long job while a reaper runs (checklist 72, 73, 77, 81; invariant 5) ---

REAPER_TIMEOUT_S = 2


class Reaper:
    """Another Queue instance calling process() (which reaps) every 0.5 s on a thread."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.reports: list = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.reports.append(self.queue.process())
            self.stop.wait(0.5)

    def join(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive()

    @property
    def reaped(self) -> int:
        return sum(r.reaped for r in self.reports)


def _long_job_setup(make_queue, job, **worker_options):
    worker = make_queue(callbacks={"long": job}, stalled_job_timeout=REAPER_TIMEOUT_S, **worker_options)
    reaper = Reaper(make_queue(callbacks={"long": job}, stalled_job_timeout=REAPER_TIMEOUT_S))
    return worker, reaper


def test_explicit_heartbeats_keep_a_long_job_from_the_reaper(make_queue, installed):
    """A job that runs 5 s by the clock against a 2 s reaper: a heartbeat every 0.5 s keeps it,
    though the reaper runs after each one; 2 s without a beat and the same reaper takes it."""
    clock, runs, reports = Clock(), [], []

    def long_job():
        runs.append(clock())
        for _ in range(10):
            clock.advance(0.5)
            worker.heartbeat()
            reports.append(reaper.process())
        runs.append(_row(installed, ids["job"]))

    worker = make_queue(
        callbacks={"long": long_job}, stalled_job_timeout=REAPER_TIMEOUT_S, heartbeat_interval=0, clock=clock
    )
    reaper = make_queue(callbacks={"long": long_job}, stalled_job_timeout=REAPER_TIMEOUT_S, clock=clock)
    ids = {"job": worker.publish("long")}
    assert worker.process_job(ids["job"]) == "claimed"
    assert len(runs) == 2, "the callback ran exactly once"
    assert len(reports) == 10 and sum(r.reaped for r in reports) == 0  # the reaper found nothing
    during = runs[1]
    assert during["state"] == JobState.PROCESSING
    assert during["updated_at"] == during["last_attempt_at"] + dt.timedelta(seconds=5)  # beats moved it
    after = _row(installed, ids["job"])
    assert (after["state"], after["number_of_attempts"], after["error_message"]) == (3, 1, None)

    set_row(installed, ids["job"], state=JobState.PROCESSING)  # the control: no beat for 2 s
    clock.advance(REAPER_TIMEOUT_S)
    assert reaper.reaper.run_once() == []
    clock.advance(0.001)
    assert [r.id for r in reaper.reaper.run_once()] == [ids["job"]]


def test_app_queries_through_the_hook_keep_a_long_job_from_the_reaper(
    make_queue, installed, app_engine, monkeypatch
):
    """heartbeat_interval = 1 s against a 2 s reaper: the throttled hook is enough."""
    runs, queries = [], []

    def long_job():
        runs.append(1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            _app_query(app_engine)
            queries.append(1)
            time.sleep(0.25)  # real: the job's work between app queries; the hook's throttle is wall-clock

    worker, reaper = _long_job_setup(make_queue, long_job, heartbeat_interval=1)
    worker.install_heartbeat(app_engine)
    writes = _count_writes(worker, monkeypatch)
    job = worker.publish("long")
    try:
        assert worker.process_job(job, on_claimed=reaper.start) == "claimed"
    finally:
        reaper.join()
    assert runs == [1]
    assert reaper.reaped == 0 and len(reaper.reports) >= 5
    assert len(queries) >= 15 and 3 <= len(writes) <= 6 and set(writes) == {1}  # throttled to ~1/s
    after = _row(installed, job)
    assert (after["state"], after["number_of_attempts"], after["error_message"]) == (3, 1, None)


def test_without_heartbeats_a_long_job_is_reaped_and_the_zombie_is_fenced_out(make_queue, installed, caplog):
    """Control: the reaper takes the job while its callback still runs; another worker claims it again
    (attempt 2) and fails it; the first worker's heartbeat and its FINISHED result change nothing."""
    caplog.set_level(logging.WARNING, logger="bgq")
    clock, seen, reports = Clock(), {}, []

    def zombie():
        clock.advance(REAPER_TIMEOUT_S + 0.001)  # no heartbeat for longer than the reaper allows
        reports.append(other.process())  # reaps the job, and leaves it in its backoff
        seen["reaped"] = _row(installed, ids["job"])
        clock.advance(60)  # the backoff of attempt 1 is over
        reports.append(other.process())  # claims it again: attempt 2, which fails
        seen["reclaimed"] = _row(installed, ids["job"])
        with pytest.raises(JobAborted):  # interval 0: it writes, fenced on attempt 1, and learns
            worker.heartbeat()
        seen["after_beat"] = _row(installed, ids["job"])

    def second_owner():
        raise TemporaryErrorException("second owner failed")

    worker = make_queue(callbacks={"long": zombie}, heartbeat_interval=0, clock=clock)
    other = make_queue(callbacks={"long": second_owner}, stalled_job_timeout=REAPER_TIMEOUT_S, clock=clock)
    ids = {"job": worker.publish("long")}
    assert worker.process_job(ids["job"]) == "claimed"

    assert seen["reaped"]["state"] == JobState.TEMPORARILY_FAILED
    assert (seen["reclaimed"]["number_of_attempts"], seen["reclaimed"]["state"]) == (2, 4)
    assert [r.reaped for r in reports] == [1, 0]
    reaped = seen["reaped"]
    assert "stalled" in reaped["error_message"] and f"(PID {os.getpid()})" in reaped["error_message"]
    assert reaped["number_of_attempts"] == 1  # the reaper does not count an attempt
    assert seen["after_beat"] == seen["reclaimed"]  # the old claim could not keep the new one alive
    after = _row(installed, ids["job"])
    assert (after["state"], after["number_of_attempts"]) == (JobState.TEMPORARILY_FAILED, 2)
    assert "second owner failed" in after["error_message"]  # not overwritten by the zombie's FINISHED
    assert after == seen["reclaimed"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("no longer PROCESSING" in m for m in messages)
    assert any("taken over" in m for m in messages)
    assert any("Stalled job reaped" in m for m in messages)


# --- the reaper on its own (SPEC 13.2 #13, #14; checklist 70-72, 74) ---


def test_reap_stalled_jobs_by_age_never_running_a_callback(make_queue, installed):
    """SPEC 13.2 #13 (timeout 3600): untouched for 7200 s -> reaped; for 60 s -> left alone."""
    ran = []
    queue = make_queue(callbacks={"job": lambda: ran.append(1)}, stalled_job_timeout=3600)
    stale, fresh = queue.publish("job"), queue.publish("job")
    now = _now(installed)
    set_row(installed, stale, state=2, pid=12345, number_of_attempts=1, last_attempt_at=now,
         updated_at=now - dt.timedelta(seconds=7200))  # fmt: skip
    set_row(installed, fresh, state=2, pid=12345, number_of_attempts=1, last_attempt_at=now,
         updated_at=now - dt.timedelta(seconds=60))  # fmt: skip
    report = queue.process()
    assert report.reaped == 1 and report.outcomes == {} and ran == []
    after = _row(installed, stale)
    assert after["state"] == JobState.TEMPORARILY_FAILED
    assert "stalled" in after["error_message"] and "PID 12345" in after["error_message"]
    assert (after["postponed_by"], after["number_of_attempts"]) == (60_000, 1)
    untouched = _row(installed, fresh)
    assert (untouched["state"], untouched["error_message"]) == (JobState.PROCESSING, None)


def test_one_process_run_reaps_a_stale_job_and_runs_it(make_queue, installed):
    """SPEC 13.2 #14 / checklist 74 (cron mode): timestamps 2 h old -> reaped and run in one process()."""
    ran = []
    queue = make_queue(callbacks={"job": lambda: ran.append(1)}, stalled_job_timeout=3600)
    job = queue.publish("job")
    old = _now(installed) - HOURS_AGO_2
    set_row(
        installed, job, state=2, number_of_attempts=1, created_at=old, last_attempt_at=old, updated_at=old
    )
    report = queue.process()
    assert (report.reaped, report.outcomes, ran) == (1, {"claimed": 1}, [1])
    after = _row(installed, job)
    assert (after["state"], after["number_of_attempts"]) == (JobState.FINISHED, 2)


# --- a worker killed by SIGKILL (checklist 70-76, invariant 4) ---


def run_one_job(url: str, table: str, ledger: str, job_id: int) -> None:
    """A worker process: process_job(job_id) with a callback that logs start/end and sleeps."""
    ledger_worker._ledger["engine"] = sa.create_engine(url)
    ledger_worker._ledger["table"] = ledger
    queue = Queue(
        callbacks={"slow": ledger_worker.slow_ledger_job},
        database_url=url,
        table_name=table,
        queue="general",
        priorities=[1, 2, 3],
    )
    queue.process_job(job_id)
    queue.close()


def test_a_sigkilled_workers_job_is_reaped_and_its_group_goes_on_in_order(make_queue, installed, monkeypatch):
    ledger = unique_name("ledger")
    ledger_worker.create_ledger(installed.url, ledger)
    engine = sa.create_engine(installed.url)
    monkeypatch.setitem(ledger_worker._ledger, "engine", engine)
    monkeypatch.setitem(ledger_worker._ledger, "table", ledger)

    def fast(token, grp=None, seconds=0.0):
        ledger_worker.slow_ledger_job(token, grp, 0.0)

    def queue_with(timeout, clock=None):
        return make_queue(
            callbacks={"slow": fast}, priorities=[1, 2, 3], stalled_job_timeout=timeout, clock=clock
        )

    queue = queue_with(3600)
    dead = queue.publish("slow", ["dead", "g", 60.0], serial_group="g", priority=1)
    worse = queue.publish("slow", ["worse", "g"], serial_group="g", priority=2)
    better = queue.publish("slow", ["better", "g"], serial_group="g", priority=1)
    ctx = multiprocessing.get_context("spawn")
    worker = ctx.Process(target=run_one_job, args=(installed.url, installed.table, ledger, dead))
    try:
        worker.start()

        def started() -> bool:
            assert worker.is_alive(), "the worker exited"
            return bool(installed.sql(f"SELECT seq FROM {ledger} WHERE token = 'dead'"))

        wait_until(started, "the worker to start the job", 30, 0.05)
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        assert worker.exitcode == -signal.SIGKILL
        killed = _row(installed, dead)
        assert (killed["state"], killed["pid"], killed["number_of_attempts"]) == (2, worker.pid, 1)

        # 72/75: while the dead job still looks alive, its group waits behind it.
        assert queue.process_job(worse) == "waiting"
        report = queue.process()
        assert report.reaped == 0 and report.outcomes == {}
        # A cron run leaves a busy group's jobs alone (it claims only idle groups' heads).
        assert [_row(installed, j)["state"] for j in (dead, worse, better)] == [2, 6, 1]

        # 1.5 s later by the clock of the queues below, the dead worker's claim is past their 1 s.
        later = Clock(_now(installed) + dt.timedelta(seconds=1.5))
        off, reaper = queue_with(0, later), queue_with(1, later)
        # 76: stalled_job_timeout = 0 disables the reaper.
        assert off.process().reaped == 0
        assert _row(installed, dead)["state"] == JobState.PROCESSING

        # 70/71: reaped, "stalled", the dead worker's PID, attempts unchanged, a backoff.
        report = reaper.process()
        assert report.reaped == 1
        reaped = _row(installed, dead)
        assert reaped["state"] == JobState.TEMPORARILY_FAILED
        assert "stalled" in reaped["error_message"] and f"(PID {worker.pid})" in reaped["error_message"]
        assert (reaped["number_of_attempts"], reaped["postponed_by"]) == (1, 60_000)
        assert [_row(installed, j)["state"] for j in (worse, better)] == [6, 1]  # dead is still first

        # 75: once its backoff is over, dead runs again, then the group in (priority, id) order.
        old = _now(installed) - HOURS_AGO_2
        set_row(installed, dead, created_at=old, last_attempt_at=old)

        def all_finished() -> bool:
            if all(_row(installed, j)["state"] == JobState.FINISHED for j in (dead, worse, better)):
                return True
            reaper.process()
            return False

        wait_until(all_finished, "dead, worse and better to finish", 8, 0.2)
        events = [
            (r["token"], r["event"], r["pid"])
            for r in installed.sql(f"SELECT token, event, pid FROM {ledger} ORDER BY seq")
        ]
    finally:
        if worker.is_alive():
            worker.kill()
        engine.dispose()
        ledger_worker.drop_ledger(installed.url, ledger)

    assert events[0] == ("dead", "start", worker.pid)  # killed: no "end"
    assert [(t, e) for t, e, _ in events[1:]] == [
        ("dead", "start"), ("dead", "end"),
        ("better", "start"), ("better", "end"),
        ("worse", "start"), ("worse", "end"),
    ]  # fmt: skip
    assert _row(installed, dead)["number_of_attempts"] == 2
