"""Contract of {table}_lost_messages: READY/TEMPORARILY_FAILED jobs whose message was lost, fenced."""

from __future__ import annotations

import pytest

from bgq.sql.signatures import LOST_MESSAGES
from tests.support.helpers import (
    T0,
    at,
    background,
    claim,
    held_transaction,
    new_job,
    procs,
    row,
    set_row,
    wait_for_lock_wait,
)

TIMEOUT_S = 600
HOURS_2 = -2 * 3600


def lost_messages(installed, now=T0, *, queue="general", timeout_s=TIMEOUT_S, limit=1000):
    with installed.db.transaction() as conn:
        return procs(installed).lost_messages(conn, queue, timeout_s, limit, now)


def refs(jobs):
    return [(j.id, j.state, j.queue, j.priority) for j in jobs]


def published(
    installed,
    *,
    job_state=1,
    updated=HOURS_2,
    created=HOURS_2,
    last_attempt=None,
    postponed_by=None,
    queue="general",
    priority=1,
):
    """A job in broker mode whose message went out; times in seconds relative to T0."""
    job = new_job(installed, queue=queue, priority=priority, broker=True)
    set_row(
        installed,
        job,
        state=job_state,
        created_at=at(created),
        updated_at=at(updated),
        last_attempt_at=None if last_attempt is None else at(last_attempt),
        postponed_by=postponed_by,
    )
    return job


@pytest.mark.parametrize("job_state", [1, 4])
def test_a_lost_job_is_returned_once_with_its_state_unchanged(installed, job_state):
    job = published(
        installed, job_state=job_state, queue="general_x", priority=2, last_attempt=-3600, postponed_by=60000
    )
    set_row(installed, job, error_message="boom", number_of_attempts=3)
    before = row(installed, job)

    assert refs(lost_messages(installed, now=T0)) == [(job, job_state, "general_x", 2)]

    after = row(installed, job)
    assert (after["state"], after["postponed_by"], after["updated_at"]) == (job_state, None, T0)
    changed = {"postponed_by", "updated_at"}
    assert {k: v for k, v in after.items() if k not in changed} == {
        k: v for k, v in before.items() if k not in changed
    }
    assert lost_messages(installed, now=at(1)) == []  # right after: updated_at moved
    assert row(installed, job) == after
    assert [j.id for j in lost_messages(installed, now=at(TIMEOUT_S + 1))] == [job]  # lost again


def test_a_fresh_job_is_not_lost(installed):
    job = published(installed, updated=-10)
    before = row(installed, job)
    assert lost_messages(installed) == []
    assert row(installed, job) == before


def test_the_timeout_is_strict(installed):
    job = published(installed, updated=-TIMEOUT_S)
    assert lost_messages(installed) == []  # exactly the timeout: not older than it
    assert [j.id for j in lost_messages(installed, now=at(0.000001))] == [job]


def test_a_job_in_its_backoff_is_not_lost(installed):
    """TEMPORARILY_FAILED 2 h ago, last attempt now, 10 minutes of backoff: the broker holds its message."""
    job = published(installed, job_state=4, updated=HOURS_2, last_attempt=0, postponed_by=600000)
    before = row(installed, job)
    assert lost_messages(installed, now=T0) == []
    assert lost_messages(installed, now=at(599.999)) == []
    assert row(installed, job) == before
    assert [j.id for j in lost_messages(installed, now=at(600))] == [job]  # the backoff is over


@pytest.mark.parametrize(
    ("created", "last_attempt", "postponed_by", "not_yet", "available_at"),
    [
        (0, None, None, -0.000001, 0),  # no delay: available from created_at on
        (0, None, 2500, 2.999, 3),  # ceil(2.5) = 3 s
        (0, None, 1, 0.5, 1),  # ceil(0.001) = 1 s
        (0, 10, 1000, 10.999, 11),  # last_attempt_at is later: counts from it
        (10, 0, 1000, 10.999, 11),  # created_at is later: counts from it
    ],
)
def test_availability_is_the_due_jobs_rule(
    installed, created, last_attempt, postponed_by, not_yet, available_at
):
    job = published(
        installed,
        job_state=4,
        updated=-7200,
        created=created,
        last_attempt=last_attempt,
        postponed_by=postponed_by,
    )
    assert lost_messages(installed, now=at(not_yet)) == []
    assert [j.id for j in lost_messages(installed, now=at(available_at))] == [job]


@pytest.mark.parametrize("job_state", [-1, 2, 3, 5, 6, 7, 8])
def test_other_states_are_untouched(installed, job_state):
    job = published(installed, job_state=job_state, postponed_by=1000)
    before = row(installed, job)
    assert lost_messages(installed) == []
    assert row(installed, job) == before


def test_only_jobs_of_the_queue_and_its_sub_queues(installed):
    mine = published(installed)
    sub = published(installed, queue="general_x")
    other = published(installed, queue="other")
    lookalike = published(installed, queue="generalx")  # shares the prefix, is not a sub-queue
    assert [j.id for j in lost_messages(installed)] == [mine, sub]
    assert row(installed, other)["updated_at"] == at(HOURS_2)
    assert row(installed, lookalike)["updated_at"] == at(HOURS_2)


def test_limit_and_id_order(installed):
    jobs = [published(installed, job_state=s, priority=p) for s, p in ((4, 3), (1, 1), (1, 2))]
    assert refs(lost_messages(installed, limit=2)) == [(jobs[0], 4, "general", 3), (jobs[1], 1, "general", 1)]
    assert [row(installed, j)["updated_at"] for j in jobs] == [T0, T0, at(HOURS_2)]
    assert [j.id for j in lost_messages(installed, now=at(1), limit=2)] == jobs[2:]


def test_lost_messages_is_fenced_by_a_concurrent_claim(installed):
    """A consumer claims the job between the pass's read and its write: the claim wins."""
    job = published(installed)
    with background() as run, held_transaction(installed) as worker:
        assert claim(installed, job, now=T0, conn=worker).outcome == "claimed"
        scan = run(lost_messages, installed, at(1))
        wait_for_lock_wait(installed)  # the pass read state 1 and waits for the claimed row
        worker.commit()
        assert scan.result(timeout=30) == []
    after = row(installed, job)
    assert (after["state"], after["updated_at"], after["number_of_attempts"]) == (2, T0, 1)


def test_lost_messages_is_fenced_on_updated_at(installed):
    """Another pass (same state, newer updated_at) got there first: it wins, the row is not touched again."""
    job = published(installed, postponed_by=1000)
    with background() as run, held_transaction(installed) as other_pass:
        other_pass.exec_driver_sql(
            f"UPDATE {installed.table} SET postponed_by = NULL, updated_at = %s WHERE id = %s", (T0, job)
        )
        scan = run(lost_messages, installed, at(1))
        wait_for_lock_wait(installed)  # the pass read the old updated_at and waits for the row
        other_pass.commit()
        assert scan.result(timeout=30) == []
    after = row(installed, job)
    assert (after["state"], after["postponed_by"], after["updated_at"]) == (1, None, T0)


def test_returned_columns(installed):
    published(installed)
    with installed.db.transaction() as conn:
        sql = installed.db.dialect.call_sql(installed.table, LOST_MESSAGES)
        result = conn.exec_driver_sql(sql, ("general", TIMEOUT_S, 10, T0))
        assert list(result.keys()) == ["id", "queue", "priority", "state"]
        assert len(result.all()) == 1
