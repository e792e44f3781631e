"""Contract of {table}_claim_ids (broker mode's batch claim): each id claimed as {table}_claim would
claim it, in the order given, in one call; grouped ids after the first deferred; fencing and races;
each part of the header (db/*/claim_ids.sql) on both dialects: parameters, Steps, Locks, Fencing,
Idempotent, Group row, Transaction."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.support.helpers import (
    PID,
    QUEUE,
    T0,
    WAITING_MS,
    at,
    background,
    claim,
    claimed,
    group_row,
    held_transaction,
    new_job,
    procs,
    row,
    run_together,
    set_row,
    utc,
    wait_for_lock_wait,
)

CLAIMABLE = (-1, 1, 4, 6, 8)


def claim_ids(installed, ids, now=T0, worker_id=None, queue=QUEUE):
    with installed.db.transaction() as conn:
        return procs(installed).claim_ids(conn, ids, queue, PID, WAITING_MS, now, worker_id=worker_id)


def test_claim_ids_claims_each_job_as_claim_would_in_one_call(installed):
    """{table}_claim_ids on every kind of id, in the order given: an ungrouped job and a group's
    head are claimed (the set-based path and claim_job give the same columns), a finished job is
    skipped, a running one unexpected, an unknown id missing, and every grouped job after the
    first is deferred, unchanged (one group's locks per transaction); each of those, claimed
    alone, is what {table}_claim returns for it: the group's next job waits, a paused group's
    job is paused."""
    plain, head, second = new_job(installed), new_job(installed, group="g"), new_job(installed, group="g")
    done, running = new_job(installed), new_job(installed)
    paused = new_job(installed, group="p")
    set_row(installed, done, state=3)
    claimed(installed, running)
    with installed.db.transaction() as conn:
        procs(installed).pause(conn, "group", "p", "tests", "tests", T0)
    order = [plain, head, second, done, running, paused, 987654]
    with installed.db.transaction() as conn:
        results = procs(installed).claim_ids(conn, order, QUEUE, PID, WAITING_MS, T0, worker_id=None)
    assert [job_id for job_id, _ in results] == order
    got = {job_id: r for job_id, r in results}
    assert [got[i].outcome for i in order] == [
        "claimed", "claimed", "deferred", "skipped", "unexpected", "deferred", "missing",
    ]  # fmt: skip
    assert [got[i].state for i in order] == [2, 2, None, 3, 2, None, None]
    assert (got[plain].attempt, got[head].attempt, got[second].attempt) == (1, 1, None)
    assert (got[plain].callback_name, got[plain].queue, got[plain].priority) == ("cb", QUEUE, 1)
    assert got[head].serial_group == "g" and got[second].callback_name is None
    rows = {r["id"]: r for r in installed.sql("SELECT id, state, pid, number_of_attempts FROM {t}")}
    assert (rows[plain]["state"], rows[plain]["pid"], rows[plain]["number_of_attempts"]) == (2, PID, 1)
    assert (rows[second]["state"], rows[paused]["state"]) == (1, 1)  # deferred: unchanged
    for job_id, outcome, state in ((second, "waiting", 6), (paused, "paused", 1)):
        with installed.db.transaction() as conn:
            ((_, alone),) = procs(installed).claim_ids(conn, [job_id], QUEUE, PID, WAITING_MS, T0)
        assert (alone.outcome, alone.state) == (outcome, state)
    assert alone.predecessor_id is None
    with installed.db.transaction() as conn:  # a second call changes nothing
        again = procs(installed).claim_ids(conn, [plain, head], QUEUE, PID, WAITING_MS, T0)
    assert [r.outcome for _, r in again] == ["unexpected", "unexpected"]


@pytest.mark.parametrize("from_state", CLAIMABLE)
def test_every_claimable_state_is_claimed_with_the_columns_claim_writes(installed, from_state):
    """The set-based path for ungrouped jobs writes what {table}_claim_job writes: PROCESSING,
    attempts + 1 (the fencing token), last_attempt_at and updated_at from p_now, pid, worker_id;
    postponed_by, error_message and metadata cleared."""
    job = new_job(installed)
    set_row(installed, job, state=from_state, number_of_attempts=3, postponed_by=60000, error_message="boom")
    ((job_id, result),) = claim_ids(installed, [job], now=at(7), worker_id=42)
    assert job_id == job and (result.outcome, result.attempt, result.state) == ("claimed", 4, 2)
    after = row(installed, job)
    assert (after["state"], after["number_of_attempts"], after["pid"], after["worker_id"]) == (2, 4, PID, 42)
    assert (after["last_attempt_at"], after["updated_at"]) == (at(7), at(7))
    assert (after["postponed_by"], after["error_message"], after["metadata"]) == (None, None, None)


def test_a_job_of_another_queue_is_missing_and_one_of_a_sub_queue_is_claimed(installed):
    other, sub = new_job(installed, queue="elsewhere"), new_job(installed, queue=f"{QUEUE}_mail")
    results = dict(claim_ids(installed, [other, sub]))
    assert (results[other].outcome, results[sub].outcome) == ("missing", "claimed")
    assert row(installed, other)["state"] == 1


def test_a_unique_duplicate_goes_through_claim_job_and_turns_redundant(installed):
    first = new_job(installed, identifier="u", mode="unique")
    second = new_job(installed, identifier="u", mode="unique")
    results = dict(claim_ids(installed, [second]))
    assert (results[second].outcome, results[second].state) == ("redundant", 7)
    assert row(installed, first)["state"] == 1


@pytest.mark.parametrize("group", [None, "g"])
def test_two_batches_with_the_same_ids_at_once_claim_each_job_once(installed, group):
    """Two consumers that got the same messages (a redelivery) claim each job once between them."""
    jobs = [new_job(installed, group=group) for _ in range(1 if group else 6)]
    both = run_together(lambda: claim_ids(installed, jobs), lambda: claim_ids(installed, jobs))
    for job in jobs:
        outcomes = sorted(dict(r)[job].outcome for r in both)
        assert outcomes == ["claimed", "unexpected"], (job, outcomes)
        assert row(installed, job)["number_of_attempts"] == 1


def test_an_id_claimed_before_is_unexpected_and_keeps_its_owner(installed):
    job = new_job(installed)
    claimed(installed, job)
    before = row(installed, job)
    ((_, result),) = claim_ids(installed, [job], now=at(30), worker_id=7)
    assert (result.outcome, result.attempt) == ("unexpected", None)
    after = row(installed, job)
    assert (after["number_of_attempts"], after["worker_id"], after["last_attempt_at"]) == (
        before["number_of_attempts"], before["worker_id"], before["last_attempt_at"],
    )  # fmt: skip


def test_an_empty_batch_calls_nothing(installed):
    assert claim_ids(installed, []) == []


def test_a_grouped_job_goes_through_claim_job_with_the_worker_and_writes_its_group_row(installed):
    """p_worker_id on the claim_job path too; Group row: the claim of a group's job writes the
    group's row (upserted here: the group had none)."""
    head = new_job(installed, group="gw")
    assert group_row(installed, "gw") is None
    ((_, result),) = claim_ids(installed, [head], now=at(3), worker_id=42)
    assert (result.outcome, result.attempt, result.serial_group) == ("claimed", 1, "gw")
    after = row(installed, head)
    assert (after["state"], after["pid"], after["worker_id"], after["last_attempt_at"]) == (2, PID, 42, at(3))
    assert group_row(installed, "gw") is not None


def test_a_job_that_has_to_wait_gets_p_waiting_ms_as_its_postponement(installed):
    """p_waiting_ms: postponed_by written when a job has to wait (its group's head runs)."""
    head, second = new_job(installed, group="gq"), new_job(installed, group="gq")
    claimed(installed, head)
    ((_, result),) = claim_ids(installed, [second], now=at(1))
    assert (result.outcome, result.state) == ("waiting", 6)
    assert (row(installed, second)["state"], row(installed, second)["postponed_by"]) == (6, WAITING_MS)


def test_an_ungrouped_job_of_a_paused_queue_is_paused_not_claimed(installed):
    """Steps: only a job that is not paused (macros/rules.sql not_paused) takes the set-based path;
    one in a paused (sub-)queue goes through claim_job, which leaves it alone."""
    job = new_job(installed, queue=f"{QUEUE}_held")
    with installed.db.transaction() as conn:
        procs(installed).pause(conn, "queue", f"{QUEUE}_held", "tests", "tests", T0)
    ((_, result),) = claim_ids(installed, [job], now=at(1))
    assert result.outcome == "paused"
    assert (row(installed, job)["state"], row(installed, job)["number_of_attempts"]) == (1, 0)


def test_without_p_now_the_claim_is_stamped_with_the_servers_clock(installed):
    """p_now NULL: the server's clock (clock_timestamp() / UTC_TIMESTAMP(6)), on both paths."""
    plain, head = new_job(installed), new_job(installed, group="gn")
    results = dict(claim_ids(installed, [plain, head], now=None))
    assert (results[plain].outcome, results[head].outcome) == ("claimed", "claimed")
    now = dt.datetime.now(dt.UTC)
    for job in (plain, head):
        stamped = utc(row(installed, job)["last_attempt_at"])
        assert stamped is not None and abs(stamped - now) < dt.timedelta(minutes=5), (job, stamped)


@pytest.mark.parametrize("holder_commits", [True, False], ids=["committed", "rolled-back"])
def test_the_update_waits_for_a_row_another_transaction_holds_and_then_rechecks_it(installed, holder_commits):
    """Locks: the set-based UPDATE waits for an ungrouped job's row another transaction holds,
    then re-checks it: claimed by that transaction (committed), it is not claimed again
    ('unexpected', the first owner's claim untouched); released unchanged (rolled back), it is
    claimed."""
    job = new_job(installed)
    with background() as run, held_transaction(installed) as holder:
        assert claim(installed, job, conn=holder).outcome == "claimed"
        batch = run(claim_ids, installed, [job], at(5), 7)
        wait_for_lock_wait(installed)
        assert not batch.done()
        if holder_commits:
            holder.commit()
        else:
            holder.rollback()
        ((_, result),) = batch.result(timeout=30)
    after = row(installed, job)
    if holder_commits:
        assert (result.outcome, result.attempt) == ("unexpected", None)
        assert (after["number_of_attempts"], after["last_attempt_at"], after["worker_id"]) == (1, T0, None)
    else:
        assert (result.outcome, result.attempt) == ("claimed", 1)
        assert (after["number_of_attempts"], after["last_attempt_at"], after["worker_id"]) == (1, at(5), 7)


def test_it_never_commits_a_rolled_back_call_claims_nothing(installed):
    """Transaction: the caller's transaction owns every write; rolled back, no job is claimed."""
    plain, head = new_job(installed), new_job(installed, group="gr")
    conn = installed.db.engine.connect()
    try:
        conn.begin()
        results = dict(procs(installed).claim_ids(conn, [plain, head], QUEUE, PID, WAITING_MS, T0))
        assert (results[plain].outcome, results[head].outcome) == ("claimed", "claimed")
        conn.rollback()
    finally:
        conn.close()
    for job in (plain, head):
        assert (row(installed, job)["state"], row(installed, job)["number_of_attempts"]) == (1, 0)
