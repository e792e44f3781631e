"""Contract of {table}_requeue: the DBA's manual requeue, its errors and its place in a serial group."""

from __future__ import annotations

import pytest

import bgq
from tests.support.helpers import T0, at, claim, claimed, finish, new_job, procs, row, set_row, state


def requeue(installed, job_id, reason="fixed the SMTP password", now=T0):
    with installed.db.transaction() as conn:
        return procs(installed).requeue(conn, job_id, reason, now)


def predecessor(installed, job_id):
    with installed.db.transaction() as conn:
        return procs(installed).predecessor(conn, job_id)


@pytest.mark.parametrize("from_state", [5, 7, 3])
def test_requeue_sends_a_finished_or_failed_job_back_to_ready(installed, from_state):
    job = new_job(installed, queue="general_x", priority=3)
    attempt = claimed(installed, job, now=T0)
    assert finish(installed, job, attempt, from_state, error="boom", postponed_by=5000, now=at(1)).finished

    ref = requeue(installed, job, "fixed it", now=at(100))

    assert (ref.id, ref.state, ref.queue, ref.priority) == (job, from_state, "general_x", 3)
    after = row(installed, job)
    assert after["state"] == 1
    assert after["error_message"] == "Requeued: fixed it"
    assert after["postponed_by"] is None
    assert after["finished_at"] is None
    assert after["updated_at"] == at(100)
    assert after["last_attempt_at"] == T0
    assert after["number_of_attempts"] == attempt
    assert claim(installed, job, now=at(101)).attempt == attempt + 1  # a new fencing token


def test_requeued_job_in_backoff_is_due_at_once(installed):
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)
    finish(installed, job, attempt, 4, error="later", postponed_by=16 * 60000, now=at(1))
    requeue(installed, job, now=at(2))
    with installed.db.transaction() as conn:
        due = procs(installed).due_jobs(conn, "general", False, 10, at(2))
    assert [(j.id, j.state) for j in due] == [(job, 1)]


def test_requeue_of_a_ready_job_is_idempotent(installed):
    job = new_job(installed)
    first = requeue(installed, job, "once", now=at(1))
    second = requeue(installed, job, "twice", now=at(2))
    assert (first.state, second.state) == (1, 1)
    after = row(installed, job)
    assert (after["state"], after["error_message"], after["updated_at"]) == (1, "Requeued: twice", at(2))
    assert after["number_of_attempts"] == 0


def test_requeue_of_an_unknown_job_raises_job_not_found(installed):
    with pytest.raises(bgq.JobNotFoundError):
        requeue(installed, 987654)


def test_requeue_of_a_processing_job_raises_job_state_error_and_changes_nothing(installed):
    job = new_job(installed, group="g")
    claimed(installed, job, now=T0)
    before = row(installed, job)
    with pytest.raises(bgq.JobStateError):
        requeue(installed, job, now=at(5))
    assert row(installed, job) == before


def test_requeued_grouped_job_takes_its_place_in_line_again(installed):
    first = new_job(installed, group="g")
    second = new_job(installed, group="g")
    attempt = claimed(installed, first)
    assert claim(installed, second).outcome == "waiting"
    assert finish(installed, first, attempt, 5, error="broken").promoted_id == second

    requeue(installed, first, now=at(10))

    assert predecessor(installed, second) == first
    result = claim(installed, second, now=at(11))
    assert (result.outcome, result.predecessor_id) == ("waiting", first)
    assert claim(installed, first, now=at(12)).outcome == "claimed"


def test_requeue_of_a_waiting_job_with_nobody_running_wakes_its_group(installed):
    first = new_job(installed, group="g")
    second = new_job(installed, group="g")
    third = new_job(installed, group="g")
    claimed(installed, first)
    for job in (second, third):
        assert claim(installed, job).outcome == "waiting"
    set_row(installed, first, state=3)  # its finish never ran

    requeue(installed, third, now=at(3))

    # third is READY again; the group's head (second) was WAITING with nobody running: promoted
    assert (state(installed, second), state(installed, third)) == (1, 1)
    with installed.db.transaction() as conn:
        assert procs(installed).group_heads(conn) == []
