"""Lifecycle lines of the checklist not covered elsewhere: die, unique, claim retries, own connection."""

from __future__ import annotations

import logging
import multiprocessing

import pytest
import sqlalchemy as sa

from bgq import DatabaseError, DeadlockError, DieException, JobState, SchemaVersionError
from tests.conftest import AMQP_URL
from tests.support.helpers import state_of, unique_name


def _die_from_cause(*args):
    raise DieException("stop after this") from ConnectionError("smtp gone")


def test_checklist_37_die_with_a_cause_is_classified_by_the_cause_and_process_stops(make_queue, installed):
    ran = []
    queue = make_queue(callbacks={"die": _die_from_cause, "next": lambda: ran.append(1)})
    dying = queue.publish("die")
    later = queue.publish("next")
    queue.process()
    row = installed.sql("SELECT state, error_message FROM {t} WHERE id = %s", (dying,))[0]
    assert row["state"] == JobState.TEMPORARILY_FAILED and "smtp gone" in row["error_message"]
    assert queue.should_die and ran == [] and state_of(installed, later) == JobState.READY


def _die_consumer(url, table, base):
    from bgq import Queue
    from bgq.broker.rabbitmq import RabbitMQ
    from bgq.modes.consume import GracefulStop, consume

    queue = Queue(
        callbacks={"die": _die_from_cause, "noop": lambda: None},
        database_url=url,
        table_name=table,
        queue=base,
        producer=RabbitMQ(AMQP_URL),
    )
    with GracefulStop() as stop:
        raise SystemExit(consume(queue, None, 0, [1], stop))


def test_checklist_37_a_consumer_exits_before_its_next_message(broker_queue, rabbit, installed):
    queue = broker_queue(callbacks={"die": _die_from_cause, "noop": lambda: None}, priorities=[1])
    dying = queue.publish("die")
    later = queue.publish("noop")
    proc = multiprocessing.get_context("spawn").Process(
        target=_die_consumer, args=(installed.url, installed.table, rabbit.base)
    )
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert state_of(installed, dying) == JobState.TEMPORARILY_FAILED
    assert state_of(installed, later) == JobState.READY and rabbit.count(f"{rabbit.base}_1") == 1


def test_checklist_40_unique_job_with_an_older_row_is_redundant_without_running(make_queue, installed):
    ran = []
    queue = make_queue(callbacks={"once": lambda: ran.append(1)})
    first = queue.publish("once", identifier="welcome-42", mode="unique")
    queue.process_job(first)
    second = queue.publish("once", identifier="welcome-42", mode="unique")
    assert queue.process_job(second) == "redundant"
    assert ran == [1] and state_of(installed, second) == JobState.REDUNDANT


def test_checklist_69_a_claim_that_keeps_deadlocking_is_retried_then_leaves_the_job_claimable(
    make_queue, installed, monkeypatch
):
    queue = make_queue()
    job = queue.publish("noop", serial_group="g", coalesce_threshold=1)
    calls = []

    def deadlock(*args, **kwargs):
        calls.append(1)
        raise DeadlockError("Deadlock found when trying to get lock")

    monkeypatch.setattr(queue.procs, "claim", deadlock)  # process_job's claim
    monkeypatch.setattr(queue.procs, "claim_batch", deadlock)  # cron mode's claim
    monkeypatch.setattr("bgq.sql.retry.time.sleep", lambda s: None)
    assert queue.process().outcomes == {"error": 1}
    assert len(calls) == 5  # CLAIM_TRIES
    assert state_of(installed, job) == JobState.READY  # never stuck in PROCESSING
    with pytest.raises(DatabaseError):
        queue.process_job(job)
    assert len(calls) == 10
    assert state_of(installed, job) == JobState.READY


def test_checklist_93_publish_never_creates_the_schema(db_url):
    from bgq import Queue

    table = unique_name("notinstalled")
    queue = Queue(callbacks={"noop": lambda: None}, database_url=db_url, table_name=table)
    with pytest.raises(SchemaVersionError, match="bgq install-procs"):
        queue.publish("noop")
    with pytest.raises(SchemaVersionError):
        queue.process()
    engine = sa.create_engine(db_url)
    try:
        assert not sa.inspect(engine).has_table(table)
    finally:
        engine.dispose()
        queue.close()


def test_checklist_104_a_rollback_in_the_callbacks_transaction_does_not_undo_the_result(
    make_queue, installed
):
    engine = sa.create_engine(installed.url)

    def rolls_back():
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
            conn.rollback()

    try:
        queue = make_queue(callbacks={"job": rolls_back})
        job = queue.publish("job")
        queue.process_job(job)
        assert state_of(installed, job) == JobState.FINISHED
    finally:
        engine.dispose()


def test_checklist_105_a_lost_database_connection_is_logged_and_replaced(
    make_queue, installed, dialect, caplog
):
    queue = make_queue()
    first = queue.publish("noop")
    queue.process_job(first)
    with queue.database.engine.connect() as conn:  # the pooled connection bgq will reuse
        own = conn.exec_driver_sql(
            "SELECT CONNECTION_ID()" if dialect == "mysql" else "SELECT pg_backend_pid()"
        ).scalar_one()
    kill = f"KILL {own}" if dialect == "mysql" else f"SELECT pg_terminate_backend({own})"
    installed.sql(kill)
    with caplog.at_level(logging.CRITICAL, logger="bgq"):
        second = queue.publish("noop")  # pool_pre_ping notices the dead connection and reconnects
    queue.process_job(second)
    assert state_of(installed, second) == JobState.FINISHED
    assert "The database connection was lost; reconnecting." in caplog.text


def test_checklist_87_redundant_and_coalesced_writes_refresh_updated_at(make_queue, installed):
    queue = make_queue()
    long_ago = "2001-01-01 00:00:00"
    older = queue.publish("noop", identifier="u", mode="unique")
    duplicate = queue.publish("noop", identifier="u", mode="unique")
    leader = queue.publish("noop", serial_group="g", coalesce_threshold=5)
    swallowed = queue.publish("noop", serial_group="g", coalesce_threshold=7)
    installed.sql("UPDATE {t} SET updated_at = %s", (long_ago,))
    assert queue.process_job(duplicate) == "redundant"
    assert queue.process_job(leader) == "claimed"
    rows = {r["id"]: r for r in installed.sql("SELECT id, state, updated_at FROM {t}")}
    assert rows[duplicate]["state"] == JobState.REDUNDANT and rows[swallowed]["state"] == JobState.REDUNDANT
    assert rows[duplicate]["updated_at"].year > 2001 and rows[swallowed]["updated_at"].year > 2001
    assert rows[older]["updated_at"].year == 2001  # untouched rows keep theirs
