"""Contract of {table}_finish_batch (many results, fenced, copies, groups woken), heartbeat's metadata."""

from __future__ import annotations

import pytest

import bgq
from bgq.model import JobResult
from tests.support.helpers import (
    PID,
    T0,
    at,
    background,
    blocked_or_done,
    claim,
    claim_batch,
    claimed,
    finish_batch,
    group_row,
    hand_off,
    held_transaction,
    new_job,
    procs,
    row,
    set_row,
    state,
    states,
    utc,
)


def _claimed_batch(installed, *jobs, now=T0):
    """Claim exactly `jobs` with one claim_batch; {id: attempt}."""
    result = claim_batch(installed, 100, now=now)
    assert sorted(c.id for c in result) == sorted(jobs)
    return {c.id: c.claim.attempt for c in result}


def _waiting_pair(installed, **second):
    """A PROCESSING job of group g and a second job of g that waits for it."""
    first = new_job(installed, group="g")
    waiter = new_job(installed, group="g", **second)
    attempt = claimed(installed, first, now=T0)
    assert claim(installed, waiter, now=T0).outcome == "waiting"
    return first, attempt, waiter


def _sql_null(installed, job_id, column):
    """Whether the column is SQL NULL (row() cannot tell SQL NULL from a stored JSON null)."""
    return bool(installed.sql(f"SELECT {column} IS NULL AS n FROM {{t}} WHERE id = %s", (job_id,))[0]["n"])


# --- the result writes ---


def test_every_result_is_written_as_finish_writes_it(installed):
    done, retry, failed, redundant = (new_job(installed) for _ in range(4))
    attempts = _claimed_batch(installed, done, retry, failed, redundant, now=T0)
    results = [
        JobResult(done, attempts[done], 3, execution_time=12, memory={"before": 1, "after": 2}),
        JobResult(retry, attempts[retry], 4, error="SMTP down", postponed_by=60000),
        JobResult(failed, attempts[failed], 5, error="bad input"),
        JobResult(redundant, attempts[redundant], 7, error="duplicate"),
    ]

    written = finish_batch(installed, results, now=at(4))

    assert written == {done: True, retry: True, failed: True, redundant: True}
    expected = {
        done: (3, None, None, 12, {"before": 1, "after": 2}, at(4)),
        retry: (4, "SMTP down", 60000, None, None, None),
        failed: (5, "bad input", None, None, None, None),
        redundant: (7, "duplicate", None, None, None, at(4)),
    }
    for job, values in expected.items():
        after = row(installed, job)
        got = tuple(after[k] for k in ("state", "error_message", "postponed_by", "execution_time", "memory"))
        assert (job, *got, after["finished_at"]) == (job, *values)
        assert after["updated_at"] == at(4)
        assert (after["number_of_attempts"], after["pid"], after["last_attempt_at"]) == (1, PID, T0)


def test_a_result_without_memory_stores_sql_null(installed):
    """As finish does with p_memory NULL: no JSON null text in the column."""
    job = new_job(installed)
    (attempt,) = _claimed_batch(installed, job).values()
    assert finish_batch(installed, [JobResult(job, attempt, 4, error="later", postponed_by=1000)]) == {
        job: True
    }
    assert _sql_null(installed, job, "memory")
    assert _sql_null(installed, job, "execution_time")
    assert _sql_null(installed, job, "error_message") is False


def test_a_temporarily_failed_job_is_claimable_again_after_its_backoff(installed):
    job = new_job(installed)
    (attempt,) = _claimed_batch(installed, job, now=T0).values()
    assert finish_batch(installed, [JobResult(job, attempt, 4, error="x", postponed_by=60000)], now=at(1))

    assert claim_batch(installed, 10, now=at(59)) == []  # last_attempt_at (T0) + 60 s
    assert [(c.id, c.claim.attempt) for c in claim_batch(installed, 10, now=at(60))] == [(job, 2)]


# --- fencing ---


def test_only_the_callers_own_claims_are_written(installed):
    mine = new_job(installed)
    stale_low, stale_high, ready, failed, finished = (new_job(installed) for _ in range(5))
    attempts = _claimed_batch(installed, mine, stale_low, stale_high, ready, failed, finished)
    set_row(installed, ready, state=1)
    set_row(installed, failed, state=4)
    set_row(installed, finished, state=3)
    others = (stale_low, stale_high, ready, failed, finished)
    before = {j: row(installed, j) for j in others}

    written = finish_batch(
        installed,
        [
            JobResult(mine, attempts[mine], 3),
            JobResult(stale_low, attempts[stale_low] - 1, 5, error="late"),
            JobResult(stale_high, attempts[stale_high] + 1, 5, error="late"),
            JobResult(ready, attempts[ready], 3),
            JobResult(failed, attempts[failed], 3),
            JobResult(finished, attempts[finished], 5, error="again"),
            JobResult(987654, 1, 3),
        ],
        now=at(3),
    )

    assert written == {
        mine: True, stale_low: False, stale_high: False, ready: False, failed: False, finished: False,
        987654: False,
    }  # fmt: skip
    assert state(installed, mine) == 3
    assert {j: row(installed, j) for j in others} == before


def test_a_repeated_finish_batch_is_fenced_out(installed):
    job = new_job(installed)
    (attempt,) = _claimed_batch(installed, job).values()
    assert finish_batch(installed, [JobResult(job, attempt, 3)], now=at(1)) == {job: True}
    before = row(installed, job)
    assert finish_batch(installed, [JobResult(job, attempt, 5, error="again")], now=at(2)) == {job: False}
    assert row(installed, job) == before


def test_an_old_token_cannot_finish_a_reaped_and_reclaimed_job(installed):
    job = new_job(installed, group="g")
    (old_token,) = _claimed_batch(installed, job, now=T0).values()
    with installed.db.transaction() as conn:
        assert [r.id for r in procs(installed).reap(conn, "general", 60, 10, at(61))] == [job]
    new_token = claimed(installed, job, pid=5151, now=at(62))
    before = row(installed, job)

    assert finish_batch(installed, [JobResult(job, old_token, 3)], now=at(63)) == {job: False}

    assert row(installed, job) == before
    assert finish_batch(installed, [JobResult(job, new_token, 3)], now=at(64)) == {job: True}
    assert state(installed, job) == 3


# --- state 1: release an unstarted job ---


def test_release_gives_the_job_back_unstarted(installed):
    job = new_job(installed)
    set_row(installed, job, number_of_attempts=2, execution_time=7, memory='{"before": 3}')
    attempt = claimed(installed, job, metadata='{"host": "w1"}', now=T0)
    assert attempt == 3

    assert finish_batch(installed, [JobResult(job, attempt, 1)], now=at(2)) == {job: True}

    after = row(installed, job)
    assert (after["state"], after["number_of_attempts"], after["pid"], after["metadata"]) == (
        1,
        2,
        None,
        None,
    )
    assert after["last_attempt_at"] == T0
    assert after["updated_at"] == at(2)
    assert (after["error_message"], after["postponed_by"], after["finished_at"]) == (None, None, None)
    assert (after["execution_time"], after["memory"]) == (7, {"before": 3})  # the last run's, kept


def test_a_released_job_is_claimable_again_with_the_same_attempt_number(installed):
    job = new_job(installed)
    (attempt,) = _claimed_batch(installed, job, now=T0).values()
    assert finish_batch(installed, [JobResult(job, attempt, 1)], now=at(1)) == {job: True}

    result = claim_batch(installed, 10, now=at(1))

    assert [(c.id, c.claim.attempt) for c in result] == [(job, attempt)]
    assert row(installed, job)["number_of_attempts"] == attempt


def test_a_released_group_head_keeps_its_place_and_its_follower_keeps_waiting(installed):
    first, attempt, waiter = _waiting_pair(installed)

    assert finish_batch(installed, [JobResult(first, attempt, 1)], now=at(1)) == {first: True}

    assert states(installed, first, waiter) == [1, 6]
    assert [c.id for c in claim_batch(installed, 10, now=at(2))] == [first]


def test_a_stale_release_changes_nothing(installed):
    job = new_job(installed)
    (attempt,) = _claimed_batch(installed, job).values()
    before = row(installed, job)
    assert finish_batch(installed, [JobResult(job, attempt + 1, 1)], now=at(1)) == {job: False}
    assert row(installed, job) == before


@pytest.mark.parametrize("dialect", ["postgres"])  # MySQL has no NOTIFY: its workers poll
def test_a_release_notifies_idle_workers_on_postgres(installed):
    done, released = new_job(installed), new_job(installed)
    attempts = _claimed_batch(installed, done, released)
    listener = procs(installed).listener()
    try:
        listener.wait(0.05)  # nothing pending from the inserts (they committed before LISTEN)
        assert finish_batch(installed, [JobResult(done, attempts[done], 3)]) == {done: True}
        assert listener.wait(0.3) is False
        assert finish_batch(installed, [JobResult(released, attempts[released], 1)]) == {released: True}
        assert listener.wait(5) is True
    finally:
        listener.close()


# --- groups are woken as by finish ---


@pytest.mark.parametrize("job_state", [3, 5, 7])
def test_a_final_result_promotes_the_groups_waiting_head(installed, job_state):
    first, attempt, waiter = _waiting_pair(installed)

    assert finish_batch(installed, [JobResult(first, attempt, job_state)], now=at(5)) == {first: True}

    after = row(installed, waiter)
    assert (after["state"], after["error_message"], after["postponed_by"]) == (1, None, None)
    assert after["updated_at"] == at(5)
    assert group_row(installed, "g")["waiting_head_id"] is None
    assert [c.id for c in hand_off(installed, "g", now=at(6))[1]] == [waiter]


def test_a_temporary_failure_of_the_head_promotes_nobody(installed):
    first, attempt, waiter = _waiting_pair(installed)
    assert finish_batch(installed, [JobResult(first, attempt, 4, postponed_by=60000)], now=at(5))
    assert states(installed, first, waiter) == [4, 6]
    assert group_row(installed, "g")["waiting_head_id"] == waiter


def test_a_temporary_failure_of_a_worse_priority_job_lets_the_better_head_go(installed):
    running = new_job(installed, group="g", priority=5)
    attempt = claimed(installed, running)
    better = new_job(installed, group="g", priority=1)
    assert claim(installed, better).outcome == "waiting"

    assert finish_batch(installed, [JobResult(running, attempt, 4, postponed_by=60000)]) == {running: True}

    assert states(installed, running, better) == [4, 1]


def test_every_group_of_the_batch_is_woken(installed):
    g_first, g_waiter = new_job(installed, group="g"), new_job(installed, group="g")
    h_first, h_waiter = new_job(installed, group="h"), new_job(installed, group="h")
    loner = new_job(installed)
    attempts = _claimed_batch(installed, g_first, h_first, loner)
    for waiter in (g_waiter, h_waiter):
        assert claim(installed, waiter).outcome == "waiting"

    written = finish_batch(
        installed,
        [JobResult(h_first, attempts[h_first], 3), JobResult(loner, attempts[loner], 3),
         JobResult(g_first, attempts[g_first], 5, error="no")],
        now=at(5),
    )  # fmt: skip

    assert written == {g_first: True, h_first: True, loner: True}
    assert states(installed, g_waiter, h_waiter) == [1, 1]


def test_a_fenced_out_result_wakes_nobody(installed):
    first, attempt, waiter = _waiting_pair(installed)
    before = row(installed, waiter)
    assert finish_batch(installed, [JobResult(first, attempt + 1, 3)], now=at(5)) == {first: False}
    assert row(installed, waiter) == before
    assert state(installed, first) == 2


# --- copies: RECURRING successors and WaitingException copies ---


def _rows(installed):
    return installed.sql("SELECT * FROM {t} ORDER BY id")


def test_a_finished_recurring_job_is_replaced_by_its_successor(installed):
    recurring = new_job(installed, identifier="nightly", mode="recurring", callback="tick", priority=2)
    set_row(installed, recurring, processed_by_broker=1)
    (attempt,) = _claimed_batch(installed, recurring).values()

    written = finish_batch(installed, [JobResult(recurring, attempt, 3, clone_delay_ms=60000)], now=at(4))

    assert written == {recurring: True}
    (successor,) = _rows(installed)  # one row per identifier: the finished one is deleted
    assert successor["id"] > recurring
    assert (successor["state"], successor["number_of_attempts"], successor["postponed_by"]) == (1, 0, 60000)
    assert (successor["callback_name"], successor["identifier"], successor["mode"]) == (
        "tick",
        "nightly",
        "recurring",
    )
    assert (successor["priority"], successor["processed_by_broker"], successor["queue"]) == (2, 1, "general")
    assert successor["parameters_json"] is not None
    assert utc(successor["created_at"]) == at(4)


def test_a_waiting_exception_keeps_its_row_and_adds_a_copy_for_every_mode(installed):
    plain = new_job(installed, group="g", threshold=9)
    tagged = new_job(installed, identifier="report-7")
    attempts = _claimed_batch(installed, plain, tagged)

    written = finish_batch(
        installed,
        [JobResult(j, attempts[j], 3, error="not yet", clone_delay_ms=1500) for j in (plain, tagged)],
        now=at(2),
    )

    assert written == {plain: True, tagged: True}
    rows = _rows(installed)
    assert [(r["id"], r["state"], r["error_message"]) for r in rows[:2]] == [
        (plain, 3, "not yet"),
        (tagged, 3, "not yet"),
    ]
    copies = rows[2:]
    by_source = {r["serial_group"] or r["identifier"]: r for r in copies}
    assert sorted(by_source) == ["g", "report-7"]
    assert (by_source["g"]["identifier"], by_source["g"]["coalesce_threshold"]) == (None, 9)
    assert (by_source["report-7"]["serial_group"], by_source["report-7"]["coalesce_threshold"]) == (
        None,
        None,
    )
    assert all((r["state"], r["postponed_by"], r["number_of_attempts"]) == (1, 1500, 0) for r in copies)


def test_no_copy_when_an_unfinished_job_of_the_identifier_exists(installed):
    first = new_job(installed, identifier="tick", mode="recurring")
    second = new_job(installed, identifier="tick", mode="recurring")
    attempt = claimed(installed, first)

    assert finish_batch(installed, [JobResult(first, attempt, 3, clone_delay_ms=1000)]) == {first: True}

    assert [r["id"] for r in _rows(installed)] == [second]


def test_a_fenced_out_result_makes_no_copy(installed):
    recurring = new_job(installed, identifier="nightly", mode="recurring")
    (attempt,) = _claimed_batch(installed, recurring).values()
    before = row(installed, recurring)

    assert finish_batch(installed, [JobResult(recurring, attempt + 1, 3, clone_delay_ms=1000)]) == {
        recurring: False
    }

    assert [r["id"] for r in _rows(installed)] == [recurring]
    assert row(installed, recurring) == before


def test_a_grouped_recurring_job_wakes_its_group_after_its_row_is_gone(installed):
    """The group of a deleted (finished RECURRING) job is still woken: its waiting head is promoted."""
    first, attempt, waiter = _waiting_pair(installed, identifier="w")
    set_row(installed, first, mode="recurring", identifier="nightly")

    written = finish_batch(installed, [JobResult(first, attempt, 3, clone_delay_ms=60000)], now=at(5))

    assert written == {first: True}
    assert row(installed, first) is None
    assert state(installed, waiter) == 1
    assert group_row(installed, "g")["waiting_head_id"] is None


# --- errors: nothing written ---


def _fails_even_if_committed(installed, results):
    """The call fails; the caller commits anyway (MySQL keeps a failed CALL's earlier writes)."""
    with held_transaction(installed) as conn:
        with pytest.raises(bgq.DatabaseError) as caught:  # translated at the call seam
            procs(installed).finish_batch(conn, results, at(9))
        conn.commit()
    return caught.value


@pytest.mark.parametrize("bad_state", [-1, 0, 2, 6, 8, 9])
def test_a_state_that_is_not_a_result_raises_and_writes_nothing(installed, bad_state):
    good = new_job(installed, group="g")
    bad = new_job(installed)
    attempts = _claimed_batch(installed, good, bad)
    before = {j: row(installed, j) for j in (good, bad)}
    group_before = group_row(installed, "g")
    results = [JobResult(good, attempts[good], 3), JobResult(bad, attempts[bad], bad_state)]

    with pytest.raises(bgq.DatabaseError) as caught:
        finish_batch(installed, results, now=at(9))
    assert type(caught.value) is bgq.DatabaseError
    assert "a result state must be 1, 3, 4, 5 or 7" in str(caught.value)
    error = _fails_even_if_committed(installed, results)
    assert type(error) is bgq.DatabaseError

    assert {j: row(installed, j) for j in (good, bad)} == before
    assert group_row(installed, "g") == group_before


def test_a_finished_recurring_job_without_a_copy_raises_and_writes_nothing(installed):
    """No recurring job silently stops recurring: its successor's delay is required."""
    good = new_job(installed, group="g")
    recurring = new_job(installed, identifier="nightly", mode="recurring")
    attempts = _claimed_batch(installed, good, recurring)
    before = {j: row(installed, j) for j in (good, recurring)}
    results = [JobResult(good, attempts[good], 3), JobResult(recurring, attempts[recurring], 3)]

    with pytest.raises(bgq.DatabaseError) as caught:
        finish_batch(installed, results, now=at(9))
    assert type(caught.value) is bgq.DatabaseError
    assert "a finished recurring job needs clone_delay_ms" in str(caught.value)
    assert type(_fails_even_if_committed(installed, results)) is bgq.DatabaseError

    assert {j: row(installed, j) for j in (good, recurring)} == before
    assert installed.sql("SELECT COUNT(*) AS n FROM {t}")[0]["n"] == 2  # no successor inserted


@pytest.mark.parametrize("job_state", [1, 4, 5, 7])
def test_other_results_of_a_recurring_job_are_written(installed, job_state):
    recurring = new_job(installed, identifier="nightly", mode="recurring")
    (attempt,) = _claimed_batch(installed, recurring).values()
    assert finish_batch(installed, [JobResult(recurring, attempt, job_state)]) == {recurring: True}
    assert state(installed, recurring) == job_state


def test_a_fenced_out_finished_recurring_job_is_no_error(installed):
    recurring = new_job(installed, identifier="nightly", mode="recurring")
    (attempt,) = _claimed_batch(installed, recurring).values()
    before = row(installed, recurring)
    assert finish_batch(installed, [JobResult(recurring, attempt + 1, 3)]) == {recurring: False}
    assert row(installed, recurring) == before


def test_an_empty_batch_returns_nothing_without_a_database_call(installed):
    conn = installed.db.engine.connect()
    conn.close()  # any statement on it would raise ResourceClosedError
    assert procs(installed).finish_batch(conn, []) == {}


# --- locks ---


def test_a_row_locked_by_another_transaction_does_not_hold_up_other_jobs_results(installed):
    """finish_batch locks its own jobs' rows only (Locks in the contract), not every row it scans."""
    busy = new_job(installed)
    job = new_job(installed)
    attempts = _claimed_batch(installed, busy, job)
    with background() as run, held_transaction(installed) as other:
        other.exec_driver_sql(f"SELECT id FROM {installed.table} WHERE id = %s FOR UPDATE", (busy,)).all()
        future = run(finish_batch, installed, [JobResult(job, attempts[job], 3)])
        blocked = blocked_or_done(installed, future)
        other.rollback()
        written = future.result(timeout=60)
    assert written == {job: True}
    assert states(installed, busy, job) == [2, 3]
    assert not blocked, "finish_batch waited for the row of a job it does not finish"


# --- heartbeat with metadata (a batched job's start) ---


def _heartbeat(installed, job_id, attempt, now, metadata_json=None):
    with installed.db.transaction() as conn:
        return procs(installed).heartbeat(conn, job_id, attempt, now, metadata_json=metadata_json)


def test_heartbeat_stores_metadata_and_keeps_it_when_none_is_given(installed):
    job = new_job(installed)
    (attempt,) = _claimed_batch(installed, job, now=T0).values()
    assert row(installed, job)["metadata"] is None

    assert _heartbeat(installed, job, attempt, at(1), '{"host": "w1", "n": [1, 2]}') is True
    after = row(installed, job)
    assert (after["metadata"], after["updated_at"]) == ({"host": "w1", "n": [1, 2]}, at(1))

    assert _heartbeat(installed, job, attempt, at(2)) is True
    after = row(installed, job)
    assert (after["metadata"], after["updated_at"]) == ({"host": "w1", "n": [1, 2]}, at(2))

    assert _heartbeat(installed, job, attempt, at(3), '{"host": "w2"}') is True
    assert row(installed, job)["metadata"] == {"host": "w2"}


def test_metadata_survives_a_final_result_and_is_cleared_by_a_release(installed):
    done, released = new_job(installed), new_job(installed)
    attempts = _claimed_batch(installed, done, released)
    for job in (done, released):
        assert _heartbeat(installed, job, attempts[job], at(1), '{"host": "w1"}') is True

    written = finish_batch(
        installed, [JobResult(done, attempts[done], 3), JobResult(released, attempts[released], 1)], now=at(2)
    )

    assert written == {done: True, released: True}
    assert row(installed, done)["metadata"] == {"host": "w1"}
    assert row(installed, released)["metadata"] is None


@pytest.mark.parametrize("token_offset", [-1, 1])
def test_heartbeat_metadata_is_fenced_on_the_claim(installed, token_offset):
    job = new_job(installed)
    (attempt,) = _claimed_batch(installed, job, now=T0).values()
    assert _heartbeat(installed, job, attempt, at(1), '{"host": "w1"}') is True
    before = row(installed, job)

    assert _heartbeat(installed, job, attempt + token_offset, at(2), '{"host": "zombie"}') is False

    assert row(installed, job) == before


@pytest.mark.parametrize("other_state", [1, 3, 4])
def test_heartbeat_metadata_never_touches_a_job_that_is_not_processing(installed, other_state):
    job = new_job(installed)
    (attempt,) = _claimed_batch(installed, job, now=T0).values()
    set_row(installed, job, state=other_state)
    before = row(installed, job)
    assert _heartbeat(installed, job, attempt, at(1), '{"host": "w1"}') is False
    assert row(installed, job) == before
