"""Pause and resume (queues, groups), cancel and abort (waiting, running and zombie jobs), both dialects."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

import bgq
from bgq.model import JobState
from bgq.sql.install import render
from tests.support.clock import Clock
from tests.support.helpers import state_of, wait_until


def _row(installed, job_id: int) -> dict[str, Any]:
    return installed.sql("SELECT * FROM {t} WHERE id = %s", (job_id,))[0]


@pytest.fixture
def unpause(installed):
    """Pauses are rows of their own table: leave none behind for the next test."""
    yield
    installed.sql("DELETE FROM {t}_paused")


# --- pause and resume ---


def test_a_paused_group_starts_nothing_and_after_resume_runs_in_priority_id_order(
    make_queue, installed, unpause
):
    ran: list[str] = []
    queue = make_queue(callbacks={"job": lambda name: ran.append(name)}, priorities=[1, 2])
    # The canonical order case: a1 b1 c2 d1 e1 f2 g1 -> a b d e g c f.
    ids = {}
    for name, priority in [("a", 1), ("b", 1), ("c", 2), ("d", 1), ("e", 1), ("f", 2), ("g", 1)]:
        ids[name] = queue.publish("job", [name], serial_group="g", priority=priority)
    other = queue.publish("job", ["ungrouped"])
    assert queue.pause("migrating the customer", group="g", by="dba@host") is True
    assert queue.pause("still migrating", group="g", by="dba@host") is False  # already paused

    queue.process()
    assert ran == ["ungrouped"]  # the rest of the queue goes on; the group waits whole
    assert [state_of(installed, i) for i in ids.values()] == [JobState.READY] * 7
    assert state_of(installed, other) == JobState.FINISHED
    (paused,) = queue.paused()
    assert (paused.kind, paused.name, paused.reason, paused.paused_by) == (
        "group", "g", "still migrating", "dba@host",
    )  # fmt: skip

    assert queue.resume(group="g") is True
    assert queue.resume(group="g") is False
    queue.process()
    assert ran == ["ungrouped", "a", "b", "d", "e", "g", "c", "f"]
    assert queue.paused() == []


def test_a_paused_queue_is_claimed_in_no_mode(make_queue, installed, unpause):
    ran: list[str] = []
    queue = make_queue(callbacks={"job": lambda name: ran.append(name)})
    plain = queue.publish("job", ["plain"])
    grouped = queue.publish("job", ["grouped"], serial_group="pg")
    sub = installed.sql("SELECT queue FROM {t} WHERE id = %s", (plain,))[0]["queue"]
    assert queue.pause("deploy", queue=sub) is True

    procs = queue.procs
    with queue.database.transaction() as conn:  # bgq work / cron mode's batch claim
        assert procs.claim_batch(conn, sub, 10, 1, None, None, 1000) == []
        assert procs.hand_off(conn, [], ["pg"], sub, 1, None, None, 1000) == ({}, [])  # the hand-off
        assert procs.due_jobs(conn, sub, False, 10) == []  # cron mode's broker-less scan
        assert procs.due_jobs(conn, sub, True, 10) == []  # broker mode's scan
    for job in (plain, grouped):  # claim by id: broker mode's consumer, cron's broker pass
        with queue.database.transaction() as conn:
            assert procs.claim(conn, job, sub, 1, 1000, None).outcome == "paused"
    assert queue.process_job(plain) == "paused"
    queue.process()
    assert ran == []
    assert {state_of(installed, plain), state_of(installed, grouped)} == {JobState.READY}

    queue.resume(queue=sub)
    queue.process()
    assert sorted(ran) == ["grouped", "plain"]


def test_pausing_a_queue_pauses_its_sub_queues_and_nothing_else(make_queue, installed, unpause):
    ran: list[str] = []
    queue = make_queue(
        callbacks={
            "job": lambda name: ran.append(name),
            "sub": {"callback": lambda name: ran.append(name), "queue": "s"},
        }
    )
    queue.publish("sub", ["in sub-queue"])
    other = make_queue(callbacks={"job": lambda name: ran.append(name)}, queue="generalx")
    other.publish("job", ["other queue"])
    queue.pause("maintenance")  # this queue: "general", and "general_s" with it
    queue.process()
    other.process()
    assert ran == ["other queue"]  # "generalx" is not a sub-queue of "general"


def test_bad_pause_targets_are_refused_before_anything_is_written(make_queue, installed, unpause):
    queue = make_queue()
    with pytest.raises(bgq.ConfigError):
        queue.pause("x", group="g", queue="q")
    with pytest.raises(bgq.ConfigError):
        queue.pause("x", group="")
    with pytest.raises(bgq.ConfigError, match="whitespace"):  # publish refuses such a group too
        queue.pause("x", group="g ")
    with pytest.raises(bgq.ConfigError, match="Invalid queue"):
        queue.pause("x", queue="bad queue!")
    with pytest.raises(bgq.DatabaseError), queue.database.transaction() as conn:  # the procedure's check
        queue.procs.pause(conn, "host", "h", "x", None)
    assert queue.paused() == []


@pytest.mark.slow
def test_the_claim_keeps_its_index_with_the_pause_test(make_queue, installed, unpause):
    """EXPLAIN the ungrouped claim (claim_batch's first branch, with the pause rule rendered in):
    the jobs table is read through its ungrouped index, the pause table by a small lookup."""
    queue = make_queue()
    with queue.bulk():
        for i in range(3000):
            queue.publish("noop", [i])
    queue.pause("x", group="some-group")
    dialect = installed.db.dialect.name
    due = render("{{ due('j') }}", installed.table, dialect).replace("v_now", "CURRENT_TIMESTAMP")
    if dialect == "postgres":
        installed.sql("ANALYZE {t}")
        sql = (
            "EXPLAIN SELECT j.id FROM {t} AS j WHERE j.serial_group IS NULL AND j.state IN (1, 4, 6, 8) "
            f"AND {due} ORDER BY j.priority, j.id LIMIT 10"
        )
        plan = "\n".join(r["QUERY PLAN"] for r in installed.sql(sql.replace("{t}", installed.table)))
        assert f"{installed.table}_ungrouped" in plan, plan
    else:
        installed.sql("ANALYZE TABLE {t}")
        sql = (
            "EXPLAIN SELECT j.id FROM {t} AS j WHERE j.ungrouped_priority IS NOT NULL "
            f"AND {due} ORDER BY j.ungrouped_priority, j.id LIMIT 10"
        )
        plan = installed.sql(sql.replace("{t}", installed.table))
        jobs = [r for r in plan if r["table"] == "j"]
        assert jobs and jobs[0]["key"] == f"{installed.table}_ungrouped", plan


# --- cancel ---


def test_cancelling_a_waiting_head_lets_the_next_job_of_its_group_run(make_queue, installed):
    ran: list[str] = []
    queue = make_queue(callbacks={"job": lambda name: ran.append(name)})
    head = queue.publish("job", ["head"], serial_group="cg")
    nxt = queue.publish("job", ["next"], serial_group="cg")
    result = queue.cancel(head, "customer left")
    assert (result.outcome, result.state) == ("cancelled", JobState.REDUNDANT)
    row = _row(installed, head)
    assert row["error_message"] == "Cancelled: customer left" and row["finished_at"] is not None
    queue.process()
    assert ran == ["next"] and state_of(installed, nxt) == JobState.FINISHED
    assert queue.cancel(head, "again").outcome == "finished"  # nothing changes
    assert queue.cancel(nxt, "too late").outcome == "finished"
    with pytest.raises(bgq.JobNotFoundError):
        queue.cancel(10**12, "no such job")


def test_cancelling_a_waiting_job_promotes_its_successor(make_queue, installed):
    """A WAITING head (its predecessor ran) cancelled: the group's next job becomes READY at once."""
    queue = make_queue()
    first = queue.publish("noop", serial_group="wg")
    second = queue.publish("noop", serial_group="wg")
    third = queue.publish("noop", serial_group="wg")
    with queue.database.transaction() as conn:
        assert queue.procs.claim(conn, first, "general", 1, 1000, None).outcome == "claimed"
    with queue.database.transaction() as conn:
        assert queue.procs.claim(conn, second, "general", 1, 1000, None).outcome == "waiting"
    with queue.database.transaction() as conn:
        queue.procs.finish(conn, first, 1, 3, None, None, 1, None)
    assert queue.cancel(second, "not needed").state == JobState.REDUNDANT
    queue.process()
    assert state_of(installed, third) == JobState.FINISHED


def _run_in_thread(queue, job_id: int) -> threading.Thread:
    worker = threading.Thread(target=queue.process_job, args=(job_id,), daemon=True)
    worker.start()
    return worker


def test_aborting_a_running_cooperative_job_stops_it_within_one_heartbeat(make_queue, installed, capsys):
    seen: dict[str, Any] = {"started": threading.Event(), "beats": 0}

    def cooperative() -> None:
        seen["started"].set()
        try:
            while True:
                time.sleep(0.1)  # real: the job's work between heartbeats, which the latency bound counts
                queue.heartbeat()
                seen["beats"] += 1
        except bgq.JobAborted as exc:
            seen["aborted_at"] = time.monotonic()
            seen["message"] = str(exc)
            raise

    queue = make_queue(callbacks={"long": cooperative}, heartbeat_interval=0)
    job = queue.publish("long")
    worker = _run_in_thread(queue, job)
    assert seen["started"].wait(15)
    wait_until(lambda: seen["beats"] >= 3, "a few heartbeats while it runs", 15)
    cancelled_at = time.monotonic()
    assert queue.cancel(job, "operator stop").outcome == "abort_requested"
    worker.join(15)
    assert not worker.is_alive()
    latency = seen["aborted_at"] - cancelled_at
    with capsys.disabled():
        print(
            f"\n[abort latency, {installed.db.dialect.name}] {latency * 1000:.0f} ms (heartbeat every 0.1 s)"
        )
    assert latency < 1.0  # one heartbeat is 0.1 s plus its write
    assert "Cancelled: operator stop" in seen["message"]
    row = _row(installed, job)
    assert row["state"] == JobState.REDUNDANT and row["error_message"] == "Cancelled: operator stop"


def test_a_callback_that_swallows_the_abort_is_still_recorded_cancelled(make_queue, installed):
    cancelled, swallowed = threading.Event(), threading.Event()

    def stubborn() -> None:
        assert cancelled.wait(15)
        try:
            queue.heartbeat()
        except bgq.JobAborted:
            swallowed.set()
            return  # ends "normally"

    queue = make_queue(callbacks={"stubborn": stubborn}, heartbeat_interval=0)
    job = queue.publish("stubborn")
    worker = _run_in_thread(queue, job)
    wait_until(lambda: state_of(installed, job) == JobState.PROCESSING, "the job is PROCESSING", 15.0)
    queue.cancel(job, "stop")
    cancelled.set()
    worker.join(15)
    assert swallowed.is_set(), "the heartbeat raised the abort in the callback"
    assert state_of(installed, job) == JobState.REDUNDANT


def test_the_automatic_heartbeat_hook_raises_the_abort_from_the_callbacks_statement(make_queue, installed):
    app_engine = sa.create_engine(installed.url)
    seen: dict[str, Any] = {"queries": 0}

    def uses_the_database() -> None:
        try:
            while True:
                with app_engine.connect() as conn:
                    conn.exec_driver_sql("SELECT 1")
                seen["queries"] += 1
        except bgq.JobAborted as exc:
            seen["aborted"] = str(exc)
            raise

    queue = make_queue(callbacks={"db": uses_the_database}, heartbeat_interval=0)
    remove = queue.install_heartbeat(app_engine)
    try:
        job = queue.publish("db")
        worker = _run_in_thread(queue, job)
        wait_until(lambda: state_of(installed, job) == JobState.PROCESSING, "the job is PROCESSING", 15.0)
        wait_until(lambda: seen["queries"] >= 3, "the callback's queries", 15.0)
        with app_engine.connect() as conn:  # another thread: never raises here
            conn.exec_driver_sql("SELECT 1")
        queue.cancel(job, "hooked")
        worker.join(15)
        assert "Cancelled: hooked" in seen["aborted"]
        assert state_of(installed, job) == JobState.REDUNDANT
    finally:
        remove()
        app_engine.dispose()


def test_a_zombie_learns_at_its_next_heartbeat_that_its_job_was_taken_over(make_queue, installed):
    seen: dict[str, Any] = {"beat": threading.Event(), "go": threading.Event()}

    def zombie() -> None:
        queue.heartbeat()
        seen["beat"].set()
        assert seen["go"].wait(15)  # meanwhile: reaped and claimed by another worker
        try:
            queue.heartbeat()
        except bgq.JobAborted as exc:
            seen["aborted"] = str(exc)
            raise

    queue = make_queue(callbacks={"zombie": zombie}, heartbeat_interval=0, stalled_job_backoff=0)
    job = queue.publish("zombie")
    worker = _run_in_thread(queue, job)
    assert seen["beat"].wait(15)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    with queue.database.transaction() as conn:  # reaped as if the worker had gone silent
        assert [r.id for r in queue.procs.reap(conn, "general", 60, 10, later)] == [job]
    with queue.database.transaction() as conn:  # the new owner
        claim = queue.procs.claim(conn, job, "general", 2, 1000, None, later)
    assert claim.outcome == "claimed" and claim.attempt == 2
    seen["go"].set()
    worker.join(15)
    assert "taken over" in seen["aborted"]
    row = _row(installed, job)  # the new owner's claim is untouched by the zombie's outcome
    assert (row["state"], row["number_of_attempts"]) == (JobState.PROCESSING, 2)
    with queue.database.transaction() as conn:
        assert queue.procs.beat(conn, job, 2).alive  # the new owner's heartbeat holds


def test_a_zombies_run_is_logged_as_taken_over_not_as_a_retry(make_queue, installed, caplog):
    """Its result is fenced out and the new owner runs the job: the run's line says so, once,
    without "retried in" nor the JobAborted text (which names the ID as well)."""
    taken: dict[str, threading.Event] = {"beat": threading.Event(), "go": threading.Event()}

    def zombie() -> None:
        queue.heartbeat()
        taken["beat"].set()
        assert taken["go"].wait(15)
        queue.heartbeat()  # raises JobAborted: taken over

    queue = make_queue(callbacks={"zombie": zombie}, heartbeat_interval=0, stalled_job_backoff=0)
    job = queue.publish("zombie")
    with caplog.at_level("INFO", logger="bgq"):
        worker = _run_in_thread(queue, job)
        assert taken["beat"].wait(15)
        later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
        with queue.database.transaction() as conn:
            assert [r.id for r in queue.procs.reap(conn, "general", 60, 10, later)] == [job]
        with queue.database.transaction() as conn:
            assert queue.procs.claim(conn, job, "general", 2, 1000, None, later).outcome == "claimed"
        taken["go"].set()
        worker.join(15)
    assert not worker.is_alive()
    ran = [r for r in caplog.records if getattr(r, "job_id", None) == job]  # the run's line
    assert [(r.levelname, r.getMessage()) for r in ran] == [
        ("WARNING", f"bgq: Job was taken over by another worker; its result is dropped. (ID: {job})")
    ]
    for record in caplog.records:
        assert "retried in" not in record.getMessage()
        assert record.getMessage().count(f"(ID: {job})") <= 1, record.getMessage()
    assert (_row(installed, job)["state"], _row(installed, job)["number_of_attempts"]) == (
        JobState.PROCESSING, 2,
    )  # fmt: skip


def test_the_heartbeat_reports_an_abort_for_the_current_attempt_only(make_queue, installed):
    """An abort requested during attempt 1 must not stop attempt 2 after a requeue."""
    clock = Clock()
    queue = make_queue(clock=clock)
    job = queue.publish("noop")
    procs = queue.procs
    with queue.database.transaction() as conn:
        assert procs.claim(conn, job, "general", 1, 1000, None).attempt == 1
    assert queue.cancel(job, "stop").outcome == "abort_requested"
    with queue.database.transaction() as conn:
        beat = procs.beat(conn, job, 1)
    assert (beat.alive, beat.abort_requested, beat.reason) == (True, True, "Cancelled: stop")
    with queue.database.transaction() as conn:
        procs.finish(conn, job, 1, 7, beat.reason, None, 1, None)
    queue.requeue(job, "run it after all")
    clock.advance(0.01)  # the next claim's clock is after the abort request
    with queue.database.transaction() as conn:
        assert procs.claim(conn, job, "general", 1, 1000, None).attempt == 2
    with queue.database.transaction() as conn:
        beat = procs.beat(conn, job, 2)
    assert (beat.alive, beat.abort_requested) == (True, False)


def _claim(queue, job_id: int, worker_id: int | None = None) -> None:
    with queue.database.transaction() as conn:
        claim = queue.procs.claim(conn, job_id, queue.config.queue, 4242, 1000, None, worker_id=worker_id)
    assert claim.outcome == "claimed"


def test_a_cancelled_job_whose_worker_went_silent_is_reaped_as_cancelled_not_retried(
    make_queue, installed, caplog
):
    """The abort could never reach the callback (its worker stopped heartbeating): the reaper
    writes what the worker would have written, REDUNDANT, and the group goes on; a stalled job
    that nobody cancelled in the same pass is retried as before."""
    ran: list[str] = []
    queue = make_queue(callbacks={"job": lambda name: ran.append(name)}, stalled_job_timeout=60)
    cancelled = queue.publish("job", ["cancelled"], serial_group="rg")
    behind = queue.publish("job", ["behind"], serial_group="rg")
    stalled = queue.publish("job", ["stalled"])
    _claim(queue, cancelled)
    _claim(queue, stalled)
    assert queue.cancel(cancelled, "operator stop").outcome == "abort_requested"
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    with caplog.at_level("WARNING", logger="bgq"):
        reaped = queue.reaper.run_once(later)
    assert [(r.id, r.state) for r in reaped] == [
        (cancelled, JobState.REDUNDANT), (stalled, JobState.TEMPORARILY_FAILED),
    ]  # fmt: skip
    assert f"it had been cancelled, so it stays cancelled. (ID: {cancelled}, PID 4242)" in caplog.text
    row = _row(installed, cancelled)
    assert (row["state"], row["error_message"], row["postponed_by"], row["number_of_attempts"]) == (
        JobState.REDUNDANT, "Cancelled: operator stop", None, 1,
    )  # fmt: skip
    assert row["finished_at"] is not None
    retried = _row(installed, stalled)
    assert retried["state"] == JobState.TEMPORARILY_FAILED and "stalled" in retried["error_message"]
    queue.process()
    assert ran == ["behind"] and state_of(installed, behind) == JobState.FINISHED


def test_an_abort_requested_during_an_earlier_attempt_does_not_cancel_a_reaped_retry(make_queue, installed):
    clock = Clock()
    queue = make_queue(stalled_job_timeout=60, clock=clock)
    job = queue.publish("noop")
    _claim(queue, job)
    assert queue.cancel(job, "stop").outcome == "abort_requested"
    with queue.database.transaction() as conn:
        queue.procs.finish(conn, job, 1, 7, "Cancelled: stop", None, 1, None)
    queue.requeue(job, "run it after all")
    clock.advance(0.01)  # the next claim's clock is after the abort request
    _claim(queue, job)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    assert [(r.id, r.state) for r in queue.reaper.run_once(later)] == [(job, JobState.TEMPORARILY_FAILED)]


def test_a_dead_workers_cancelled_job_is_reaped_as_cancelled(make_queue, installed):
    from bgq.model import WorkerMode
    from bgq.modes.registry import Registry

    queue = make_queue(worker_heartbeat_interval=60, worker_dead_after=180, stalled_job_timeout=3600)
    job = queue.publish("noop")
    with Registry(queue, WorkerMode.WORK, "general") as registry:
        _claim(queue, job, worker_id=registry.id)
        assert queue.cancel(job, "customer left").outcome == "abort_requested"
        later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)  # the worker's row is silent by then
        (reaped,) = queue.reaper.run_once(later)
    assert (reaped.id, reaped.state) == (job, JobState.REDUNDANT)
    row = _row(installed, job)
    assert (row["state"], row["error_message"]) == (JobState.REDUNDANT, "Cancelled: customer left")
    assert row["finished_at"] is not None and row["postponed_by"] is None


def test_broker_mode_a_reaped_cancelled_job_is_not_sent_and_its_waiting_successor_is(
    broker_queue, rabbit, installed
):
    queue = broker_queue(stalled_job_timeout=60)
    first = queue.publish("noop", serial_group="bw")
    second = queue.publish("noop", serial_group="bw")
    assert rabbit.bodies(f"{rabbit.base}_1") == [str(first), str(second)]  # taken by hand
    _claim(queue, first)
    with queue.database.transaction() as conn:
        assert queue.procs.claim(conn, second, rabbit.base, 4242, 1000, None).outcome == "waiting"
    assert queue.cancel(first, "not needed").outcome == "abort_requested"
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    assert [(r.id, r.state) for r in queue.reaper.run_once(later)] == [(first, JobState.REDUNDANT)]
    assert state_of(installed, second) == JobState.READY
    assert rabbit.bodies(f"{rabbit.base}_1") == [str(second)]  # the successor, not the cancelled job


def test_broker_mode_a_paused_jobs_message_comes_back_delayed_and_runs_after_resume(
    broker_queue, rabbit, installed, unpause
):
    from bgq.modes.consume import consume
    from bgq.modes.stopping import GracefulStop

    ran: list[str] = []
    queue = broker_queue(callbacks={"job": lambda name: ran.append(name)})
    job = queue.publish("job", ["paused one"], serial_group="bg")
    queue.pause("broker test", group="bg")
    assert rabbit.bodies(f"{rabbit.base}_1") == [str(job)]  # the consumer's delivery, taken by hand
    assert queue.process_job(job) == "paused"  # what the consumer does with it
    assert state_of(installed, job) == JobState.READY and ran == []
    assert rabbit.count(f"{rabbit.base}_1_5000") == 1  # sent back, due again in 5 s

    queue.resume(group="bg")
    stop = GracefulStop()
    consumer = threading.Thread(target=consume, args=(queue, None, 0, [1, 2, 3], stop), daemon=True)
    consumer.start()
    try:
        wait_until(lambda: state_of(installed, job) == JobState.FINISHED, "the job is FINISHED", 30.0)
    finally:
        stop.requested = True
        consumer.join(15)
    assert ran == ["paused one"]


def test_the_lost_message_pass_leaves_paused_jobs_alone(make_queue, installed, unpause):
    """A paused job's message circles through the delay queue: no second copy is sent for it."""
    queue = make_queue()
    job = queue.publish("noop", serial_group="lg")
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)  # the job looks lost by then
    queue.pause("x", group="lg")
    with queue.database.transaction() as conn:
        assert queue.procs.lost_messages(conn, "general", 3600, 10, later) == []
    queue.resume(group="lg")
    with queue.database.transaction() as conn:
        assert [j.id for j in queue.procs.lost_messages(conn, "general", 3600, 10, later)] == [job]
