"""Contract of {table}_back_to_broker: the queue's BACK_TO_BROKER jobs become READY for re-publishing."""

from __future__ import annotations

from bgq.sql.signatures import BACK_TO_BROKER
from tests.support.helpers import (
    T0,
    at,
    background,
    claim,
    group_row,
    held_transaction,
    new_job,
    procs,
    row,
    set_row,
    states,
    wait_for_lock_wait,
)


def back_to_broker(installed, now=T0, *, queue="general", limit=1000):
    with installed.db.transaction() as conn:
        return procs(installed).back_to_broker(conn, queue, limit, now)


def refs(jobs):
    return [(j.id, j.state, j.queue, j.priority) for j in jobs]


def sent_back(installed, **columns):
    """A job an operator set to BACK_TO_BROKER by hand."""
    job = new_job(installed, queue=columns.pop("queue", "general"), priority=columns.pop("priority", 1))
    set_row(installed, job, state=-1, **columns)
    return job


def test_back_to_broker_jobs_become_ready_and_are_returned(installed):
    job = sent_back(
        installed,
        queue="general_x",
        priority=3,
        postponed_by=600000,
        error_message="boom",
        updated_at=at(-60),
    )
    before = row(installed, job)

    assert refs(back_to_broker(installed, now=at(1))) == [(job, None, "general_x", 3)]

    after = row(installed, job)
    assert (after["state"], after["postponed_by"], after["updated_at"]) == (1, None, at(1))
    changed = {"state", "postponed_by", "updated_at"}
    assert {k: v for k, v in after.items() if k not in changed} == {
        k: v for k, v in before.items() if k not in changed
    }  # error_message, attempts, last_attempt_at, ... are kept


def test_other_states_are_untouched(installed):
    others = {}
    for job_state in (1, 2, 3, 4, 5, 6, 7, 8):
        job = new_job(installed)
        set_row(installed, job, state=job_state, updated_at=at(-60))
        others[job] = row(installed, job)
    mine = sent_back(installed)
    assert [j.id for j in back_to_broker(installed)] == [mine]
    for job, before in others.items():
        assert row(installed, job) == before


def test_only_jobs_of_the_queue_and_its_sub_queues(installed):
    mine = sent_back(installed)
    sub = sent_back(installed, queue="general_x")
    other = sent_back(installed, queue="other")
    lookalike = sent_back(installed, queue="generalx")  # shares the prefix, is not a sub-queue
    assert [j.id for j in back_to_broker(installed)] == [mine, sub]
    assert states(installed, mine, sub, other, lookalike) == [1, 1, -1, -1]


def test_limit_and_id_order(installed):
    jobs = [sent_back(installed, priority=p) for p in (3, 1, 2)]
    assert refs(back_to_broker(installed, limit=2)) == [
        (jobs[0], None, "general", 3),
        (jobs[1], None, "general", 1),
    ]
    assert states(installed, *jobs) == [1, 1, -1]
    assert [j.id for j in back_to_broker(installed, limit=2)] == jobs[2:]


def test_back_to_broker_is_idempotent(installed):
    job = sent_back(installed)
    assert len(back_to_broker(installed, now=at(1))) == 1
    before = row(installed, job)
    assert back_to_broker(installed, now=at(2)) == []
    assert row(installed, job) == before


def test_a_grouped_job_keeps_its_place_in_the_group(installed):
    first = sent_back(installed)
    set_row(installed, first, serial_group="g")
    second = new_job(installed, group="g")
    assert claim(installed, second, now=T0).outcome == "waiting"  # behind first (BACK_TO_BROKER)
    group_before = group_row(installed, "g")

    assert [j.id for j in back_to_broker(installed, now=at(1))] == [first]

    assert group_row(installed, "g") == group_before  # no lock, no wake: the order is unchanged
    assert states(installed, first, second) == [1, 6]
    assert claim(installed, first, now=at(2)).outcome == "claimed"


def test_back_to_broker_is_fenced_by_a_concurrent_claim(installed):
    """A consumer claims the job between the pass's read and its write: the claim wins."""
    claimed_meanwhile = sent_back(installed)
    free = sent_back(installed)
    with background() as run, held_transaction(installed) as worker:
        assert claim(installed, claimed_meanwhile, now=T0, conn=worker).outcome == "claimed"
        sender = run(back_to_broker, installed, at(1))
        wait_for_lock_wait(installed)  # the pass read state -1 and waits for the claimed row
        worker.commit()
        assert [j.id for j in sender.result(timeout=30)] == [free]
    after = row(installed, claimed_meanwhile)
    assert (after["state"], after["updated_at"], after["number_of_attempts"]) == (2, T0, 1)
    assert states(installed, free) == [1]


def test_returned_columns(installed):
    sent_back(installed)
    with installed.db.transaction() as conn:
        sql = installed.db.dialect.call_sql(installed.table, BACK_TO_BROKER)
        result = conn.exec_driver_sql(sql, ("general", 10, T0))
        assert list(result.keys()) == ["id", "queue", "priority"]
        assert len(result.all()) == 1
