"""Contract of {table}_broker_failed: a job whose id the broker refused becomes BROKER_FAILED, fenced."""

from __future__ import annotations

import pytest

from bgq.sql.signatures import BROKER_FAILED
from tests.support.helpers import (
    T0,
    at,
    background,
    claim,
    claimed,
    finish,
    group_row,
    held_transaction,
    new_job,
    procs,
    row,
    set_row,
    utc,
    wait_for_lock_wait,
)

ERROR = "Connection refused (amqp://broker:5672)"


def broker_failed(installed, job_id, error=ERROR, now=T0):
    with installed.db.transaction() as conn:
        return procs(installed).broker_failed(conn, job_id, error, now)


@pytest.mark.parametrize("from_state", [-1, 1, 4])
def test_a_job_waiting_for_its_message_becomes_broker_failed(installed, from_state):
    job = new_job(installed, queue="general_x", priority=2, postponed_by=5000)
    set_row(installed, job, state=from_state, error_message="earlier", updated_at=at(-60))
    before = row(installed, job)

    assert broker_failed(installed, job, now=at(1)) is True

    after = row(installed, job)
    assert (after["state"], after["error_message"], after["updated_at"]) == (8, ERROR, at(1))
    changed = {"state", "error_message", "updated_at"}
    assert {k: v for k, v in after.items() if k not in changed} == {
        k: v for k, v in before.items() if k not in changed
    }  # postponed_by, attempts, queue, ... are kept


@pytest.mark.parametrize("other_state", [2, 3, 5, 6, 7])
def test_processing_waiting_and_finished_jobs_are_untouched(installed, other_state):
    job = new_job(installed)
    set_row(installed, job, state=other_state, error_message="mine", updated_at=at(-60))
    before = row(installed, job)
    assert broker_failed(installed, job, now=at(1)) is False
    assert row(installed, job) == before


def test_a_claimed_job_is_untouched(installed):
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)
    before = row(installed, job)
    assert broker_failed(installed, job, now=at(1)) is False
    assert row(installed, job) == before
    assert finish(installed, job, attempt, now=at(2)).finished  # its owner still owns it


def test_missing_job_is_not_changed(installed):
    job = new_job(installed)
    assert broker_failed(installed, job + 1000) is False
    assert row(installed, job)["state"] == 1


def test_broker_failed_is_idempotent_and_keeps_the_first_error(installed):
    job = new_job(installed)
    assert broker_failed(installed, job, "first", now=at(1)) is True
    before = row(installed, job)
    assert broker_failed(installed, job, "second", now=at(2)) is False
    assert row(installed, job) == before
    assert before["error_message"] == "first"


def test_a_broker_failed_job_is_due_in_broker_mode_and_claimable(installed):
    job = new_job(installed, broker=True)
    assert broker_failed(installed, job, now=T0)
    with installed.db.transaction() as conn:
        due = procs(installed).due_jobs(conn, "general", True, 10, at(1))
    assert [(j.id, j.state) for j in due] == [(job, 8)]
    result = claim(installed, job, now=at(2))
    assert (result.outcome, result.attempt) == ("claimed", 1)
    assert row(installed, job)["error_message"] is None


def test_a_grouped_job_keeps_its_place_in_the_group(installed):
    first = new_job(installed, group="g")
    second = new_job(installed, group="g")
    assert claim(installed, second, now=T0).outcome == "waiting"  # behind first, which is READY
    group_before = group_row(installed, "g")

    assert broker_failed(installed, first, now=at(1)) is True

    assert group_row(installed, "g") == group_before  # no lock, no wake: the order is unchanged
    with installed.db.transaction() as conn:
        assert procs(installed).predecessor(conn, second) == first
    assert claim(installed, first, now=at(2)).outcome == "claimed"
    assert claim(installed, second, now=at(3)).outcome == "waiting"


def test_broker_failed_is_fenced_by_a_concurrent_claim(installed):
    """A claim holds the row when the publisher's failure is written: the claim wins, nothing changes."""
    job = new_job(installed)
    with background() as run, held_transaction(installed) as worker:
        assert claim(installed, job, now=T0, conn=worker).outcome == "claimed"
        marker = run(broker_failed, installed, job, ERROR, at(1))
        wait_for_lock_wait(installed)  # broker_failed waits for the claimed row
        worker.commit()
        assert marker.result(timeout=30) is False
    after = row(installed, job)
    assert (after["state"], after["error_message"], after["updated_at"]) == (2, None, T0)


def test_now_null_uses_the_server_clock(installed):
    job = new_job(installed)
    clock = f"SELECT {installed.db.dialect.now_sql()} AS now"
    before = utc(installed.sql(clock)[0]["now"])
    assert broker_failed(installed, job, now=None) is True
    after = utc(installed.sql(clock)[0]["now"])
    assert before <= row(installed, job)["updated_at"] <= after


def test_returned_columns(installed):
    job = new_job(installed)
    with installed.db.transaction() as conn:
        sql = installed.db.dialect.call_sql(installed.table, BROKER_FAILED)
        result = conn.exec_driver_sql(sql, (job, ERROR, T0))
        assert list(result.keys()) == ["changed"]
        assert [tuple(r) for r in result.all()] == [(1,)]
