"""Contract of {table}_reap: stalled PROCESSING jobs become TEMPORARILY_FAILED, fenced on updated_at."""

from __future__ import annotations

import pytest

from tests.support.helpers import (
    PID,
    T0,
    at,
    background,
    blocked_or_done,
    claim,
    claimed,
    held_transaction,
    new_job,
    procs,
    row,
    set_row,
    states,
    utc,
)

TIMEOUT_S = 60


def reap(installed, now, *, queue="general", timeout_s=TIMEOUT_S, limit=1000, backoff_ms=None):
    with installed.db.transaction() as conn:
        return procs(installed).reap(conn, queue, timeout_s, limit, now, backoff_ms=backoff_ms)


def stalled_message(since: str, pid: int = PID) -> str:
    return (
        f"Job was stalled in the processing state since {since} (PID {pid}); "
        "the consumer died without writing a result."
    )


def test_stalled_job_becomes_temporarily_failed(installed):
    job = new_job(installed, queue="general_x", priority=2)
    claimed(installed, job, now=T0)  # updated_at = T0 = 2030-01-01 12:00:00.123456

    reaped = reap(installed, at(TIMEOUT_S + 1))

    assert [(r.id, r.queue, r.priority, r.pid) for r in reaped] == [(job, "general_x", 2, PID)]
    assert utc(reaped[0].stalled_since) == T0
    after = row(installed, job)
    assert after["state"] == 4
    assert after["error_message"] == stalled_message("2030-01-01 12:00:00.123456")
    assert after["number_of_attempts"] == 1
    assert after["postponed_by"] == 60000
    assert after["updated_at"] == at(TIMEOUT_S + 1)
    assert after["last_attempt_at"] == T0


@pytest.mark.parametrize(
    ("attempts", "backoff_ms"),
    [(0, 30000), (1, 60000), (2, 120000), (3, 240000), (4, 480000), (5, 960000), (6, 960000), (40, 960000)],
)
def test_backoff_is_min_16_2_to_the_n_minus_1_minutes(installed, attempts, backoff_ms):
    job = new_job(installed)
    claimed(installed, job, now=T0)
    set_row(installed, job, number_of_attempts=attempts)
    assert [r.id for r in reap(installed, at(TIMEOUT_S + 1))] == [job]
    after = row(installed, job)
    assert (after["postponed_by"], after["number_of_attempts"]) == (backoff_ms, attempts)


@pytest.mark.parametrize("backoff_ms", [0, 1500])
def test_p_backoff_ms_replaces_the_retry_backoff(installed, backoff_ms):
    """stalled_job_backoff: a reaped job may run again after p_backoff_ms, whatever its attempts."""
    jobs = [new_job(installed) for _ in range(2)]
    for job in jobs:
        claimed(installed, job, now=T0)
    set_row(installed, jobs[1], number_of_attempts=4)
    assert [r.id for r in reap(installed, at(TIMEOUT_S + 1), backoff_ms=backoff_ms)] == jobs
    assert [(row(installed, j)["state"], row(installed, j)["postponed_by"]) for j in jobs] == [
        (4, backoff_ms),
        (4, backoff_ms),
    ]


def test_backoff_does_not_overflow_for_a_job_that_failed_very_often(installed):
    """A job retried for weeks (1100 attempts) is reaped like any other: 16 minutes, no error."""
    job = new_job(installed)
    other = new_job(installed)
    claimed(installed, job, now=T0)
    claimed(installed, other, now=T0)
    set_row(installed, job, number_of_attempts=1100)
    assert [r.id for r in reap(installed, at(TIMEOUT_S + 1))] == [job, other]
    assert row(installed, job)["postponed_by"] == 960000


def test_pid_is_reported_and_a_missing_pid_reads_0(installed):
    job = new_job(installed)
    claimed(installed, job, pid=31337, now=T0)
    orphan = new_job(installed)
    claimed(installed, orphan, now=T0)
    set_row(installed, orphan, pid=None)
    reaped = reap(installed, at(TIMEOUT_S + 1))
    assert [(r.id, r.pid) for r in reaped] == [(job, 31337), (orphan, None)]
    assert row(installed, job)["error_message"] == stalled_message("2030-01-01 12:00:00.123456", 31337)
    assert row(installed, orphan)["error_message"] == stalled_message("2030-01-01 12:00:00.123456", 0)


def test_fresh_processing_job_is_untouched(installed):
    job = new_job(installed)
    claimed(installed, job, now=T0)
    before = row(installed, job)
    assert reap(installed, at(TIMEOUT_S)) == []  # exactly the timeout: not older than it
    assert reap(installed, at(10)) == []
    assert row(installed, job) == before
    assert [r.id for r in reap(installed, at(TIMEOUT_S + 0.000001))] == [job]


def test_only_processing_jobs_of_the_queue_are_reaped(installed):
    mine = new_job(installed)
    sub = new_job(installed, queue="general_x")
    other = new_job(installed, queue="other")
    lookalike = new_job(installed, queue="generalx")
    for job, queue in ((mine, "general"), (sub, "general"), (other, "other"), (lookalike, "generalx")):
        claimed(installed, job, queue=queue, now=T0)
    idle = {}
    for job_state in (-1, 1, 3, 4, 5, 6, 7, 8):
        job = new_job(installed)
        set_row(installed, job, state=job_state, updated_at=T0)
        idle[job] = row(installed, job)
    assert [r.id for r in reap(installed, at(TIMEOUT_S + 1))] == [mine, sub]
    assert states(installed, other, lookalike) == [2, 2]
    for job, before in idle.items():
        assert row(installed, job) == before


def test_limit_and_id_order(installed):
    jobs = [new_job(installed) for _ in range(3)]
    for job in reversed(jobs):
        claimed(installed, job, now=T0)
    assert [r.id for r in reap(installed, at(TIMEOUT_S + 1), limit=2)] == jobs[:2]
    assert states(installed, *jobs) == [4, 4, 2]
    assert [r.id for r in reap(installed, at(TIMEOUT_S + 2), limit=2)] == jobs[2:]


def test_reap_is_idempotent(installed):
    job = new_job(installed)
    claimed(installed, job, now=T0)
    assert len(reap(installed, at(TIMEOUT_S + 1))) == 1
    before = row(installed, job)
    assert reap(installed, at(TIMEOUT_S + 2)) == []
    assert row(installed, job) == before


def test_reaping_a_grouped_job_leaves_the_waiting_jobs_and_the_group_can_go_on(installed):
    stuck = new_job(installed, group="g")
    waiter = new_job(installed, group="g")
    claimed(installed, stuck, now=T0)
    assert claim(installed, waiter, now=T0).outcome == "waiting"

    assert [r.id for r in reap(installed, at(TIMEOUT_S + 1))] == [stuck]

    assert states(installed, stuck, waiter) == [4, 6]
    result = claim(installed, stuck, pid=5151, now=at(TIMEOUT_S + 2))
    assert (result.outcome, result.attempt) == ("claimed", 2)


def test_reap_skips_a_row_a_heartbeat_holds_and_the_heartbeat_wins(installed):
    """A heartbeat holds the row (not committed yet): the reaper skips it without waiting; once
    the heartbeat commits, the job is alive and nothing is reaped."""
    job = new_job(installed)
    claimed(installed, job, now=T0)
    heartbeat_at = at(TIMEOUT_S + 1)
    with background() as run, held_transaction(installed) as worker:
        worker.exec_driver_sql(
            f"UPDATE {installed.table} SET updated_at = %s WHERE id = %s AND state = 2", (heartbeat_at, job)
        )
        reaper = run(reap, installed, at(TIMEOUT_S + 2))
        assert not blocked_or_done(installed, reaper), "the reaper waited for the held row"
        assert reaper.result(timeout=5) == []
        worker.commit()
    assert reap(installed, at(TIMEOUT_S + 2)) == []
    after = row(installed, job)
    assert (after["state"], after["updated_at"], after["error_message"]) == (2, heartbeat_at, None)


def test_reap_never_waits_for_a_frozen_worker_s_row_and_reaps_it_once_the_lock_is_gone(installed):
    """A worker froze inside its heartbeat transaction on one of five stalled jobs: the reaper
    returns at once with the other four reaped; when the frozen session ends (rolled back, as the
    server does when it cuts it), the next call reaps the fifth."""
    jobs = [new_job(installed) for _ in range(5)]
    attempts = [claimed(installed, job, now=T0) for job in jobs]
    frozen = jobs[2]
    with background() as run, held_transaction(installed) as worker:
        assert procs(installed).heartbeat(worker, frozen, attempts[2], now=at(TIMEOUT_S + 1)) is True
        reaper = run(reap, installed, at(TIMEOUT_S + 2))
        assert not blocked_or_done(installed, reaper), "the reaper waited for the frozen worker's row"
        assert sorted(r.id for r in reaper.result(timeout=5)) == sorted(set(jobs) - {frozen})
        assert states(installed, *jobs) == [4, 4, 2, 4, 4]
        worker.rollback()
    assert [r.id for r in reap(installed, at(TIMEOUT_S + 3))] == [frozen]
    assert states(installed, *jobs) == [4, 4, 4, 4, 4]
