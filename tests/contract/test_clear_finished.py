"""Contract of {table}_clear_finished: FINISHED rows of the queue go, and group rows nobody needs."""

from __future__ import annotations

import pytest

from tests.support.helpers import (
    T0,
    at,
    claim,
    claimed,
    finish,
    group_row,
    held_transaction,
    new_job,
    procs,
    row,
    set_row,
    states,
)


def clear(installed, before=None, *, queue="general", now=T0):
    with installed.db.transaction() as conn:
        return procs(installed).clear_finished(conn, queue, before, now)


def job_in(installed, job_state, *, created=T0, queue="general", group=None):
    job = new_job(installed, queue=queue, group=group)
    set_row(installed, job, state=job_state, created_at=created)
    return job


def test_checklist_91_only_finished_rows_are_deleted(installed):
    jobs = {s: job_in(installed, s, created=at(-10)) for s in (-1, 1, 2, 3, 4, 5, 6, 7, 8)}
    assert clear(installed) == 1
    assert row(installed, jobs[3]) is None
    assert states(installed, *(jobs[s] for s in (-1, 1, 2, 4, 5, 6, 7, 8))) == [-1, 1, 2, 4, 5, 6, 7, 8]


def test_checklist_91_redundant_rows_stay(installed):
    redundant = job_in(installed, 7, created=at(-100))
    finished = job_in(installed, 3, created=at(-100))
    assert clear(installed) == 1
    assert states(installed, redundant, finished) == [7, None]


def test_checklist_91_p_before_keeps_younger_rows(installed):
    old = job_in(installed, 3, created=at(-86400 * 3))
    edge = job_in(installed, 3, created=at(-86400))
    young = job_in(installed, 3, created=at(-86399.999999))
    assert clear(installed, at(-86400)) == 2  # created_at <= p_before
    assert states(installed, old, edge, young) == [None, None, 3]
    assert clear(installed, at(-86400)) == 0


def test_checklist_91_null_before_deletes_every_finished_row_up_to_now(installed):
    jobs = [job_in(installed, 3, created=at(-s)) for s in (0, 1, 10**6)]
    future = job_in(installed, 3, created=at(60))
    assert clear(installed, None) == 3
    assert states(installed, *jobs, future) == [None, None, None, 3]
    assert clear(installed, None, now=None) == 0  # the server's clock: T0 + 60 s is in 2030
    assert clear(installed, None, now=at(60)) == 1


def test_checklist_9_only_the_queue_and_its_sub_queues(installed):
    mine = job_in(installed, 3)
    sub = job_in(installed, 3, queue="general_x")
    other = job_in(installed, 3, queue="other")
    lookalike = job_in(installed, 3, queue="generalx")
    assert clear(installed) == 2
    assert states(installed, mine, sub, other, lookalike) == [None, None, 3, 3]
    assert clear(installed, queue="other") == 1
    assert states(installed, other, lookalike) == [None, 3]


def test_idempotent(installed):
    job_in(installed, 3)
    assert clear(installed) == 1
    assert clear(installed) == 0


def group_rows(installed):
    return sorted(r["serial_group"] for r in installed.sql("SELECT serial_group FROM {t}_group"))


def test_group_rows_without_unfinished_jobs_are_deleted(installed):
    # "done": its only job finished; "failed": finished for good; "busy": one READY job left;
    # "running": one PROCESSING job; "waiting": a WAITING job behind a running one.
    done = new_job(installed, group="done")
    finish(installed, done, claimed(installed, done))
    failed = new_job(installed, group="failed")
    finish(installed, failed, claimed(installed, failed), 5)
    busy_done = new_job(installed, group="busy")
    finish(installed, busy_done, claimed(installed, busy_done))
    new_job(installed, group="busy")
    running = new_job(installed, group="running")
    claimed(installed, running)
    head = new_job(installed, group="waiting")
    waiter = new_job(installed, group="waiting")
    claimed(installed, head)
    assert claim(installed, waiter).outcome == "waiting"
    assert group_rows(installed) == ["busy", "done", "failed", "running", "waiting"]

    assert clear(installed) == 2  # the finished jobs of "done" and "busy"

    assert group_rows(installed) == ["busy", "running", "waiting"]
    assert group_row(installed, "waiting")["waiting_head_id"] == waiter


def test_group_rows_are_cleared_for_every_queue_and_even_with_no_job_deleted(installed):
    """A group row has no queue: it goes when no job of any queue still needs it."""
    other = new_job(installed, group="g-other", queue="other")
    finish(installed, other, claimed(installed, other, queue="other"))
    pending = new_job(installed, group="g-pending", queue="other")
    set_row(installed, pending, state=4)
    installed.sql(
        "INSERT INTO {t}_group (serial_group, updated_at) VALUES (%s, %s), (%s, %s)",
        ("g-pending", T0, "g-orphan", T0),
    )
    assert clear(installed) == 0
    assert group_rows(installed) == ["g-pending"]


def test_a_deleted_group_row_is_recreated_by_the_next_claim(installed):
    first = new_job(installed, group="g")
    finish(installed, first, claimed(installed, first))
    assert clear(installed) == 1
    assert group_rows(installed) == []
    second = new_job(installed, group="g")
    third = new_job(installed, group="g")
    claimed(installed, second, now=at(1))
    assert claim(installed, third, now=at(2)).outcome == "waiting"
    assert group_row(installed, "g")["waiting_head_id"] == third
    assert clear(installed, now=at(3)) == 0
    assert group_row(installed, "g")["waiting_head_id"] == third


def test_a_group_row_in_use_is_skipped_not_waited_for(installed):
    """A transaction holds the group row (as a claim does): clear_finished neither waits nor deletes it."""
    job = new_job(installed, group="g")
    finish(installed, job, claimed(installed, job))
    with held_transaction(installed) as other:
        other.exec_driver_sql(
            f"SELECT * FROM {installed.table}_group WHERE serial_group = 'g' FOR UPDATE"
        ).all()
        assert clear(installed) == 1
        assert group_rows(installed) == ["g"]
    assert clear(installed) == 0
    assert group_rows(installed) == []


@pytest.mark.parametrize("job_state", [3, 5, 7])
def test_the_group_check_counts_only_unfinished_states(installed, job_state):
    job = new_job(installed, group="g")
    finish(installed, job, claimed(installed, job))
    set_row(installed, job, state=job_state)
    clear(installed)
    assert group_rows(installed) == []
