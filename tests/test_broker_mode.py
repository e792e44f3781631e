"""Broker mode on real RabbitMQ and both dialects: publishing, promotion, process() passes, consumers."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import multiprocessing
import os
import signal
from collections import defaultdict

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from bgq import JobState
from tests.conftest import AMQP_URL
from tests.support import ledger_worker
from tests.support.helpers import set_row, state_of, wait_until


def _ago(**delta) -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(**delta)


def test_checklist_11_publish_sends_the_id_to_its_priority_queue(broker_queue, rabbit, installed):
    queue = broker_queue()
    now = queue.publish("noop", priority=2)
    later = queue.publish("noop", priority=1, postpone_by=5000)
    assert rabbit.bodies(f"{rabbit.base}_2") == [str(now)]
    assert rabbit.count(f"{rabbit.base}_1_5000") == 1  # a TTL queue that dead-letters into _1
    assert (
        installed.sql("SELECT processed_by_broker FROM {t} WHERE id = %s", (later,))[0]["processed_by_broker"]
        == 1
    )


def test_checklist_14_15_broker_down_marks_broker_failed_and_process_runs_it(make_queue, installed, caplog):
    from bgq.broker.rabbitmq import RabbitMQ

    ran = []
    queue = make_queue(
        callbacks={"job": lambda: ran.append(1)}, producer=RabbitMQ("amqp://guest:guest@127.0.0.1:1/")
    )
    with caplog.at_level(logging.CRITICAL, logger="bgq"):
        job = queue.publish("job")
    row = installed.sql("SELECT state, error_message FROM {t} WHERE id = %s", (job,))[0]
    assert row["state"] == JobState.BROKER_FAILED and row["error_message"]
    assert "Publishing to the broker failed" in caplog.text
    queue.process()
    assert ran == [1] and state_of(installed, job) == JobState.FINISHED


def test_checklist_58_finishing_job_sends_its_waiting_successor(broker_queue, rabbit, installed):
    queue = broker_queue()
    first = queue.publish("noop", serial_group="g")
    second = queue.publish("noop", serial_group="g")
    assert queue.process_job(second) == "waiting"
    rabbit.purge()
    queue.process_job(first)
    row = installed.sql("SELECT state, postponed_by FROM {t} WHERE id = %s", (second,))[0]
    assert (row["state"], row["postponed_by"]) == (JobState.READY, None)
    assert rabbit.bodies(f"{rabbit.base}_1") == [str(second)]


def test_checklist_32_59_temporary_failure_is_resent_delayed_and_wakes_nobody(
    broker_queue, rabbit, installed
):
    def fail():
        raise RuntimeError("later")

    queue = broker_queue(callbacks={"fail": fail, "noop": lambda: None})
    first = queue.publish("fail", serial_group="g")
    second = queue.publish("noop", serial_group="g")
    assert queue.process_job(second) == "waiting"
    rabbit.purge()
    queue.process_job(first)
    assert state_of(installed, first) == JobState.TEMPORARILY_FAILED
    assert state_of(installed, second) == JobState.WAITING
    assert rabbit.count(f"{rabbit.base}_1_60000") == 1 and rabbit.bodies(f"{rabbit.base}_1") == []


def test_checklist_60_promoting_a_non_waiting_row_sends_nothing(broker_queue, rabbit, installed):
    queue = broker_queue()
    running = queue.publish("noop", serial_group="g")
    set_row(installed, running, state=2)
    rabbit.purge()
    with installed.db.transaction() as conn:
        assert queue.procs.promote_waiting(conn) == []
    queue.process()
    assert state_of(installed, running) == JobState.PROCESSING
    assert rabbit.bodies(f"{rabbit.base}_1") == []


def test_checklist_62_63_64_process_in_broker_mode(broker_queue, rabbit, installed):
    queue = broker_queue(lost_message_timeout=3600)
    back = queue.publish("noop")
    ready = queue.publish("noop")
    heads = []
    for group in ("gA", "gB"):
        blocker = queue.publish("noop", serial_group=group)
        set_row(installed, blocker, state=2)
        waiting = [queue.publish("noop", serial_group=group, priority=p) for p in (2, 1, 3)]
        for job in waiting:
            assert queue.process_job(job) == "waiting"
        set_row(installed, blocker, state=3)
        heads.append(waiting[1])
    set_row(installed, back, state=-1)
    rabbit.purge()
    report = queue.process()
    assert state_of(installed, back) == JobState.READY  # 64: BACK_TO_BROKER -> READY and sent
    assert sorted(rabbit.bodies(f"{rabbit.base}_1")) == sorted([str(back), *map(str, heads)])  # 62
    assert report.promoted == 2 and state_of(installed, ready) == JobState.READY  # 63: READY not re-sent


def test_checklist_82_84_lost_messages_are_resent_once(broker_queue, rabbit, installed, caplog):
    queue = broker_queue(lost_message_timeout=3600)
    lost, fresh, backoff = (queue.publish("noop") for _ in range(3))
    set_row(installed, lost, updated_at=_ago(hours=2), created_at=_ago(hours=2))
    set_row(
        installed,
        backoff,
        state=4,
        updated_at=_ago(hours=2),
        last_attempt_at=_ago(seconds=1),
        postponed_by=600_000,
    )
    rabbit.purge()
    with caplog.at_level(logging.WARNING, logger="bgq"):
        assert queue.process().republished == 1
        assert queue.process().republished == 0
    assert rabbit.bodies(f"{rabbit.base}_1") == [str(lost)]
    assert f"Lost broker message republished (ID: {lost})" in caplog.text
    assert installed.sql("SELECT state, postponed_by FROM {t} WHERE id = %s", (lost,))[0] == {
        "state": 1,
        "postponed_by": None,
    }
    assert state_of(installed, fresh) == 1


def test_checklist_12_13_session_publishes_after_commit_and_rollback_publishes_nothing(
    broker_queue, rabbit, installed
):
    queue = broker_queue()
    engine = create_engine(installed.url)
    try:
        with Session(engine) as session:
            committed = queue.publish("noop", connection=session)
            assert rabbit.bodies(f"{rabbit.base}_1") == []  # nothing before the commit
            session.commit()
        assert rabbit.bodies(f"{rabbit.base}_1") == [str(committed)]
        with Session(engine) as session:
            rolled_back = queue.publish("noop", connection=session)
            session.rollback()
        with Session(engine) as session:  # nested: only the savepoint's job is forgotten
            outer = queue.publish("noop", connection=session)
            savepoint = session.begin_nested()
            queue.publish("noop", connection=session)
            savepoint.rollback()
            session.commit()
        assert rabbit.bodies(f"{rabbit.base}_1") == [str(outer)]
        assert state_of(installed, rolled_back) is None
    finally:
        engine.dispose()


def test_a_released_savepoint_of_a_session_sends_nothing_before_the_outermost_commit(
    broker_queue, rabbit, installed
):
    """SQLAlchemy fires a Session's after_commit when a savepoint is released too: the ids wait
    for the outermost commit, and a rollback after the release sends nothing."""
    queue = broker_queue()
    engine = create_engine(installed.url)
    try:
        with Session(engine) as session:
            with session.begin_nested():
                kept = queue.publish("noop", connection=session)
            assert rabbit.bodies(f"{rabbit.base}_1") == []  # released, not committed
            session.commit()
        assert rabbit.bodies(f"{rabbit.base}_1") == [str(kept)]
        with Session(engine) as session:
            with session.begin_nested():
                dropped = queue.publish("noop", connection=session)
            session.rollback()
        assert rabbit.bodies(f"{rabbit.base}_1") == []
        assert state_of(installed, dropped) is None
    finally:
        engine.dispose()


def test_a_session_joined_to_an_application_transaction_sends_at_that_transactions_commit(
    broker_queue, rabbit, installed
):
    """A Session that joins a Connection's transaction (join_transaction_mode) commits only its
    savepoint: the ids go with the Connection's commit, or nowhere on its rollback."""
    queue = broker_queue()
    engine = create_engine(installed.url)
    try:
        for outcome in ("rollback", "commit"):
            with engine.connect() as conn:
                conn.begin()
                with Session(bind=conn, join_transaction_mode="create_savepoint") as session:
                    job = queue.publish("noop", connection=session)
                    session.commit()
                assert rabbit.bodies(f"{rabbit.base}_1") == []  # the application's transaction is open
                getattr(conn, outcome)()
            sent = rabbit.bodies(f"{rabbit.base}_1")
            if outcome == "rollback":
                assert sent == [] and state_of(installed, job) is None
            else:
                assert sent == [str(job)] and state_of(installed, job) == JobState.READY
    finally:
        engine.dispose()


def test_a_savepoint_opened_before_the_first_publish_on_a_connection_drops_its_ids_on_rollback(
    broker_queue, rabbit, installed
):
    queue = broker_queue()
    engine = create_engine(installed.url)
    try:
        with engine.connect() as conn:
            conn.begin()
            outer = conn.begin_nested()
            inner = conn.begin_nested()  # two levels open before the outbox first sees conn
            dropped = queue.publish("noop", connection=conn)
            inner.rollback()
            kept = queue.publish("noop", connection=conn)
            outer.commit()
            conn.commit()
        assert rabbit.bodies(f"{rabbit.base}_1") == [str(kept)]
        assert state_of(installed, dropped) is None and state_of(installed, kept) == JobState.READY
    finally:
        engine.dispose()


def test_checklist_12_13_connection_publishes_after_commit(broker_queue, rabbit, installed):
    queue = broker_queue()
    engine = create_engine(installed.url)
    try:
        with engine.connect() as conn:
            first = queue.publish("noop", connection=conn)
            assert rabbit.bodies(f"{rabbit.base}_1") == []
            conn.commit()
            assert rabbit.bodies(f"{rabbit.base}_1") == [str(first)]
            assert state_of(installed, first) == JobState.READY  # committed before it was sent
            queue.publish("noop", connection=conn)
            conn.rollback()
            nested_outer = queue.publish("noop", connection=conn)
            savepoint = conn.begin_nested()
            queue.publish("noop", connection=conn)
            savepoint.rollback()
            conn.commit()
        assert rabbit.bodies(f"{rabbit.base}_1") == [str(nested_outer)]
    finally:
        engine.dispose()


def _start_consumers(installed, ledger, base, count):
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(
            target=ledger_worker.consume_ledger, args=(installed.url, installed.table, ledger, AMQP_URL, base)
        )
        for _ in range(count)
    ]
    for p in procs:
        p.start()
    return procs


def test_seed_6_canonical_order_through_the_broker_with_two_consumers(
    broker_queue, rabbit, installed, ledger
):
    """Seed Test 6 / checklists 52, 53, 98, 99: two consumer processes, order a b d e g c f,
    never two jobs of the group at once; `reload-consumers 2` (die messages) stops both with 0."""
    queue = broker_queue(callbacks={"ledger": ledger_worker.ledger_job})
    ids = [
        queue.publish("ledger", [m[0], "demo"], serial_group="demo", priority=int(m[1]))
        for m in ("a1", "b1", "c2", "d1", "e1", "f2", "g1")
    ]
    procs = _start_consumers(installed, ledger, rabbit.base, 2)
    try:
        wait_until(
            lambda: all(state_of(installed, i) == JobState.FINISHED for i in ids),
            "every job FINISHED",
            60.0,
            0.1,
        )
        for _ in range(2):
            queue.config.producer.publish_die(rabbit.base)
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            p.kill() if p.is_alive() else None
    events = ledger_worker.read_ledger(installed.url, ledger)
    assert [token for _, token, _, event in events if event == "start"] == list("abdegcf")
    for i in range(0, len(events), 2):
        assert events[i][3] == "start" and events[i + 1][3] == "end" and events[i][1] == events[i + 1][1]


def test_sigterm_lets_the_running_job_finish_and_write_its_result(broker_queue, rabbit, installed, ledger):
    queue = broker_queue(callbacks={"slow": ledger_worker.slow_ledger_job})
    job = queue.publish("slow", ["s", None, 2.0])
    (proc,) = _start_consumers(installed, ledger, rabbit.base, 1)
    wait_until(lambda: ledger_worker.read_ledger(installed.url, ledger) != [], "a job ran", 60.0, 0.1)
    os.kill(proc.pid, signal.SIGTERM)
    proc.join(30)
    assert proc.exitcode == 0
    assert state_of(installed, job) == JobState.FINISHED
    assert [e[3] for e in ledger_worker.read_ledger(installed.url, ledger)] == ["start", "end"]


def test_a_killed_consumer_does_not_get_its_job_run_twice(broker_queue, rabbit, installed, ledger):
    """Checklist 86: the message is acknowledged once the claim commits, so killing the consumer (and
    with it its AMQP connection) mid-job redelivers nothing; the job waits for the reaper."""
    queue = broker_queue(callbacks={"slow": ledger_worker.slow_ledger_job})
    job = queue.publish("slow", ["k", None, 5.0])
    (victim,) = _start_consumers(installed, ledger, rabbit.base, 1)
    wait_until(lambda: ledger_worker.read_ledger(installed.url, ledger) != [], "a job ran", 60.0, 0.1)
    victim.kill()
    victim.join(10)
    (survivor,) = _start_consumers(installed, ledger, rabbit.base, 1)
    # A later job of the same queue, run by the survivor: a redelivered message of the killed
    # consumer's job would have come to it first.
    later = queue.publish("slow", ["later", None, 0.0])
    wait_until(lambda: state_of(installed, later) == JobState.FINISHED, "the later job to run", 60.0, 0.1)
    starts = defaultdict(int)
    for _, token, _, event in ledger_worker.read_ledger(installed.url, ledger):
        starts[(token, event)] += 1
    assert starts == {("k", "start"): 1, ("later", "start"): 1, ("later", "end"): 1}
    assert state_of(installed, job) == JobState.PROCESSING
    assert rabbit.count(f"{rabbit.base}_1") == 0
    survivor.terminate()
    survivor.join(30)
    assert survivor.exitcode == 0


def test_checklist_85_lost_message_pass_off_with_timeout_0_and_in_cron_mode(
    broker_queue, make_queue, rabbit, installed
):
    queue = broker_queue(lost_message_timeout=0)
    lost = queue.publish("noop")
    set_row(installed, lost, updated_at=_ago(hours=2), created_at=_ago(hours=2))
    rabbit.purge()
    assert queue.process().republished == 0 and rabbit.bodies(f"{rabbit.base}_1") == []
    cron = make_queue(lost_message_timeout=60, queue=rabbit.base, priorities=[1, 2, 3])
    cron.process()  # cron mode runs the job itself and sends nothing
    assert rabbit.bodies(f"{rabbit.base}_1") == [] and state_of(installed, lost) == JobState.FINISHED


def test_checklist_74_a_reaped_job_is_resent_with_its_backoff(broker_queue, rabbit, installed):
    queue = broker_queue(stalled_job_timeout=60)
    job = queue.publish("noop")
    set_row(
        installed, job, state=2, number_of_attempts=1, updated_at=_ago(hours=2), last_attempt_at=_ago(hours=2)
    )
    rabbit.purge()
    assert queue.process().reaped == 1
    assert state_of(installed, job) == JobState.TEMPORARILY_FAILED
    assert rabbit.bodies(f"{rabbit.base}_1_60000") == [str(job)]  # attempt 1: a 1-minute backoff


def test_a_deadlock_in_a_step_of_the_broker_pass_runs_that_step_again(
    broker_queue, rabbit, installed, monkeypatch
):
    """On Galera a lost certification (1213) is an everyday answer: each step of `bgq process`
    in broker mode (the reaper, the release of BACK_TO_BROKER jobs, the due jobs, the promotion
    of stuck groups' heads, the lost-message pass) runs again after one, instead of ending the
    pass and leaving the safety nets undone until the next cron run."""
    from bgq import DeadlockError

    queue = broker_queue(stalled_job_timeout=60, lost_message_timeout=3600)
    stalled, back, lost = (queue.publish("noop") for _ in range(3))
    set_row(
        installed,
        stalled,
        state=2,
        number_of_attempts=1,
        updated_at=_ago(hours=2),
        last_attempt_at=_ago(hours=2),
    )
    set_row(installed, back, state=-1)
    set_row(installed, lost, updated_at=_ago(hours=2), created_at=_ago(hours=2))
    blocker = queue.publish("noop", serial_group="gA")
    set_row(installed, blocker, state=2)
    head = queue.publish("noop", serial_group="gA")
    assert queue.process_job(head) == "waiting"
    set_row(installed, blocker, state=3)
    steps = ("reap", "back_to_broker", "due_jobs", "promote_waiting", "lost_messages")
    failed: list[str] = []
    for name in steps:
        real = getattr(queue.procs, name)

        def once(*args, _real=real, _name=name, **kwargs):
            if _name not in failed:
                failed.append(_name)
                raise DeadlockError("Deadlock found when trying to get lock")
            return _real(*args, **kwargs)

        monkeypatch.setattr(queue.procs, name, once)
    rabbit.purge()
    report = queue.process()
    assert failed == list(steps)
    assert (report.reaped, report.promoted, report.republished) == (1, 1, 1)
    assert state_of(installed, back) == JobState.READY
    assert sorted(rabbit.bodies(f"{rabbit.base}_1")) == sorted([str(back), str(head), str(lost)])


def test_checklist_56_a_locked_group_is_left_unchanged_and_the_id_resent(broker_queue, rabbit, installed):
    """The group lock stays held by another claim for longer than 3 s: process_job returns
    'locked' without raising, changes nothing and sends the id again (broker mode)."""
    queue = broker_queue()
    holder = queue.publish("noop", serial_group="g")
    job = queue.publish("noop", serial_group="g")
    rabbit.purge()
    with installed.db.engine.connect() as conn:
        conn.begin()
        assert queue.procs.claim(conn, holder, rabbit.base, 1, 1000, None).outcome == "claimed"
        assert queue.process_job(job) == "locked"
        conn.rollback()
    assert state_of(installed, job) == JobState.READY
    assert rabbit.bodies(f"{rabbit.base}_1") == [str(job)]


def test_connection_publishing_works_on_every_checkout_of_a_pooled_connection(
    broker_queue, rabbit, installed
):
    """The outbox belongs to the Connection object, not to the pooled DBAPI connection behind it."""
    queue = broker_queue()
    engine = create_engine(installed.url, pool_size=1, max_overflow=0)  # every begin() reuses one connection
    try:
        ids = []
        for _ in range(3):
            with engine.begin() as conn:
                ids.append(queue.publish("noop", connection=conn))
        assert rabbit.bodies(f"{rabbit.base}_1") == [str(i) for i in ids]
    finally:
        engine.dispose()


def test_a_send_whose_broker_failed_mark_also_fails_logs_it_and_sends_the_others(
    make_queue, installed, monkeypatch, caplog
):
    """The broker refuses one id and the database is cut as the job is marked BROKER_FAILED: send()
    does not raise (the job is READY in the table, the lost-message pass sends it again), logs
    both failures, and still sends the jobs after it."""
    from bgq import ConnectionLostError
    from bgq.broker import BrokerError

    class Refusing:
        sent: list[int] = []

        def publish(self, job_id, queue, priority, delay_ms):
            if job_id == first:
                raise BrokerError("refused")
            self.sent.append(job_id)

    queue = make_queue()
    first, second = queue.publish("noop"), queue.publish("noop")
    producer = Refusing()
    monkeypatch.setattr(queue.sender, "config", dataclasses.replace(queue.config, producer=producer))

    def cut(*args, **kwargs):
        raise ConnectionLostError("cut")

    monkeypatch.setattr(queue.store.procs, "broker_failed", cut)
    monkeypatch.setattr("bgq.sql.retry.time.sleep", lambda seconds: None)
    with caplog.at_level(logging.CRITICAL, logger="bgq"):
        queue.sender.send([(first, "general", 1, None), (second, "general", 1, None)])
    assert producer.sent == [second]
    assert f"Publishing to the broker failed. (ID: {first})" in caplog.text
    assert f"BROKER_FAILED failed as well; the lost-message pass sends it again. (ID: {first};" in caplog.text
    assert state_of(installed, first) == JobState.READY
