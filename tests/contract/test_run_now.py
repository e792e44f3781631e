"""Contract of {table}_run_now: a not-started job skips the rest of its postponement."""

from __future__ import annotations

import pytest

import bgq
from tests.support.helpers import T0, at, claim, claimed, finish, new_job, procs, row, set_row, state


def run_now(installed, job_id, reason="alice: go", now=T0):
    with installed.db.transaction() as conn:
        return procs(installed).run_now(conn, job_id, reason, now)


def due(installed, now):
    with installed.db.transaction() as conn:
        return [j.id for j in procs(installed).due_jobs(conn, "general", False, 10, now)]


def test_run_now_makes_a_postponed_ready_job_due_at_once(installed):
    job = new_job(installed, queue="general_x", priority=2, postponed_by=3_600_000)
    other = new_job(installed, postponed_by=3_600_000)
    for j in (job, other):
        set_row(installed, j, created_at=T0)
    assert due(installed, at(5)) == []

    ref = run_now(installed, job, "alice: the campaign starts now", now=at(5))

    assert (ref.id, ref.state, ref.queue, ref.priority) == (job, 1, "general_x", 2)
    after = row(installed, job)
    assert (after["state"], after["postponed_by"], after["updated_at"]) == (1, None, at(5))
    assert after["error_message"] == "Run now: alice: the campaign starts now"
    assert after["number_of_attempts"] == 0
    assert due(installed, at(6)) == [job]
    assert row(installed, other)["postponed_by"] == 3_600_000


def test_run_now_ends_a_backoff_and_keeps_the_error(installed):
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)
    finish(installed, job, attempt, 4, error="SMTP timeout", postponed_by=16 * 60000, now=at(1))
    assert due(installed, at(2)) == []

    ref = run_now(installed, job, "bob: SMTP is back", now=at(2))

    assert ref.state == 4
    after = row(installed, job)
    assert (after["state"], after["postponed_by"]) == (4, None)
    assert after["error_message"] == "SMTP timeout\nRun now: bob: SMTP is back"
    assert due(installed, at(3)) == [job]


def test_run_now_of_a_due_job_is_idempotent(installed):
    job = new_job(installed)
    run_now(installed, job, "once", now=at(1))
    run_now(installed, job, "twice", now=at(2))
    after = row(installed, job)
    assert (after["state"], after["postponed_by"], after["updated_at"]) == (1, None, at(2))
    assert after["error_message"] == "Run now: once\nRun now: twice"


def test_run_now_of_an_unknown_job_raises_job_not_found(installed):
    with pytest.raises(bgq.JobNotFoundError):
        run_now(installed, 987654321)


@pytest.mark.parametrize("final", [2, 3, 5, 7])
def test_run_now_refuses_a_started_or_finished_job_and_changes_nothing(installed, final):
    job = new_job(installed, postponed_by=0)
    attempt = claimed(installed, job, now=T0)
    if final != 2:
        finish(installed, job, attempt, final, error="x", postponed_by=60000, now=at(1))
    before = row(installed, job)
    with pytest.raises(bgq.JobStateError):
        run_now(installed, job, now=at(2))
    assert row(installed, job) == before
    assert state(installed, job) == final


def test_run_now_refuses_a_waiting_job(installed):
    head = new_job(installed, group="g")
    second = new_job(installed, group="g")
    claimed(installed, head, now=T0)
    assert claim(installed, second, now=at(1)).outcome == "waiting"
    with pytest.raises(bgq.JobStateError):
        run_now(installed, second, now=at(2))
    assert state(installed, second) == 6
