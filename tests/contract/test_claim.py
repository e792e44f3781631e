"""Contract of {table}_claim: every outcome, the claim's writes, coalescing, UNIQUE, fencing and races."""

from __future__ import annotations

import json
import time
import uuid
from concurrent import futures

import pytest

from bgq.sql.install import GROUP_LOCK_WAIT_S
from tests.support.helpers import (
    PID,
    QUEUE,
    T0,
    at,
    background,
    claim,
    claimed,
    finish,
    group_row,
    held_transaction,
    lock_timeout_setting,
    new_job,
    old_snapshot,
    processing_count,
    row,
    run_together,
    set_row,
    state,
    states,
    wait_for_lock_wait,
)

CLAIMABLE = (-1, 1, 4, 6, 8)


# --- claimed ---


def test_claim_ready_job_writes_the_claim_and_returns_the_job(installed):
    job = new_job(installed, priority=2, group="g", identifier="id-1", threshold=None)
    before = row(installed, job)

    result = claim(installed, job, metadata='{"host": "w1"}', now=at(5))

    assert result.outcome == "claimed"
    assert result.attempt == 1
    assert result.state == 2
    assert result.predecessor_id is None
    assert result.promoted_id is None
    assert (result.callback_name, result.queue, result.priority) == ("cb", QUEUE, 2)
    assert (result.serial_group, result.identifier, result.mode) == ("g", "id-1", "normal")
    assert result.coalesce_threshold is None
    after = row(installed, job)
    assert after["state"] == 2
    assert after["number_of_attempts"] == 1
    assert after["last_attempt_at"] == at(5)
    assert after["updated_at"] == at(5)
    assert after["pid"] == PID
    assert after["metadata"] == {"host": "w1"}
    assert after["postponed_by"] is None
    assert after["error_message"] is None
    assert after["created_at"] == before["created_at"]


@pytest.mark.parametrize("from_state", CLAIMABLE)
def test_every_claimable_state_is_claimed_and_the_token_counts_attempts(installed, from_state):
    job = new_job(installed)
    set_row(installed, job, state=from_state, number_of_attempts=3, postponed_by=60000, error_message="boom")

    result = claim(installed, job)

    assert (result.outcome, result.attempt, result.state) == ("claimed", 4, 2)
    after = row(installed, job)
    assert (after["state"], after["number_of_attempts"]) == (2, 4)
    assert after["postponed_by"] is None
    assert after["error_message"] is None


def test_claim_without_metadata_stores_null(installed):
    job = new_job(installed)
    set_row(installed, job, state=4, metadata='{"old": true}')
    claimed(installed, job, metadata=None)
    assert row(installed, job)["metadata"] is None


@pytest.mark.parametrize("group", [None, "g"])
def test_claim_stores_its_worker_id_and_a_claim_without_one_stores_null(installed, group):
    job = new_job(installed, group=group)
    loser = new_job(installed, group=group)  # waits (grouped) or stays READY: never written
    claimed(installed, job, worker_id=7_000_000_000)  # a BIGINT
    if group is not None:
        assert claim(installed, loser, worker_id=9).outcome == "waiting"
    assert (row(installed, job)["worker_id"], row(installed, loser)["worker_id"]) == (7_000_000_000, None)

    set_row(installed, job, state=4)
    claimed(installed, job, now=at(1))
    assert row(installed, job)["worker_id"] is None


def test_claim_returns_the_stored_parameters(installed):
    job = new_job(installed, parameters_json='{"a": [1, "x"]}')
    result = claim(installed, job)
    parameters = result.parameters_json
    if isinstance(parameters, str):  # MySQL returns JSON as text, psycopg parses it
        parameters = json.loads(parameters)
    assert parameters == {"a": [1, "x"]}
    assert result.parameters is None


def test_job_of_a_sub_queue_is_claimed_through_its_base_queue(installed):
    job = new_job(installed, queue="general_x")
    result = claim(installed, job, queue="general")
    assert (result.outcome, result.queue) == ("claimed", "general_x")


# --- missing ---


def test_claim_of_an_unknown_id_is_missing(installed):
    result = claim(installed, 987654)
    assert result.outcome == "missing"
    assert (result.attempt, result.state, result.callback_name, result.queue) == (None, None, None, None)


@pytest.mark.parametrize("job_queue", ["generalx", "other", "General", "gen"])
def test_job_of_another_queue_is_missing_and_untouched(installed, job_queue):
    job = new_job(installed, queue=job_queue)
    before = row(installed, job)
    result = claim(installed, job, queue="general")
    assert result.outcome == "missing"
    assert (result.state, result.queue, result.callback_name) == (None, None, None)
    assert row(installed, job) == before


# --- skipped / unexpected ---


@pytest.mark.parametrize("done_state", [3, 7])
def test_finished_or_redundant_job_is_skipped_and_untouched(installed, done_state):
    job = new_job(installed, group="g")
    set_row(installed, job, state=done_state, number_of_attempts=1)
    before = row(installed, job)
    result = claim(installed, job, now=at(9))
    assert (result.outcome, result.state, result.attempt) == ("skipped", done_state, None)
    assert row(installed, job) == before


@pytest.mark.parametrize("odd_state", [2, 5])
def test_processing_or_permanently_failed_job_is_unexpected_and_untouched(installed, odd_state):
    job = new_job(installed)
    set_row(installed, job, state=odd_state, number_of_attempts=1, pid=1, updated_at=T0)
    before = row(installed, job)
    result = claim(installed, job, pid=999, now=at(9))
    assert (result.outcome, result.state, result.attempt) == ("unexpected", odd_state, None)
    assert row(installed, job) == before


def test_second_claim_of_a_claimed_job_is_unexpected(installed):
    job = new_job(installed)
    assert claimed(installed, job, now=T0) == 1
    before = row(installed, job)
    result = claim(installed, job, pid=7, now=at(1))
    assert (result.outcome, result.attempt, result.state) == ("unexpected", None, 2)
    assert row(installed, job) == before


# --- waiting ---


def test_job_behind_a_processing_job_of_its_group_waits(installed):
    first = new_job(installed, group="g")
    second = new_job(installed, group="g")
    claimed(installed, first)

    result = claim(installed, second, waiting_ms=2500, now=at(3))

    assert (result.outcome, result.state, result.attempt) == ("waiting", 6, None)
    assert result.predecessor_id == first
    assert result.promoted_id is None
    after = row(installed, second)
    assert after["state"] == 6
    assert after["error_message"] == f"Waiting for job ID {first}"
    assert after["postponed_by"] == 2500
    assert after["updated_at"] == at(3)
    assert after["number_of_attempts"] == 0
    assert after["last_attempt_at"] is None
    assert state(installed, first) == 2


def test_job_behind_a_better_priority_ready_job_waits(installed):
    worse = new_job(installed, group="g", priority=2)
    better = new_job(installed, group="g", priority=1)
    result = claim(installed, worse)
    assert (result.outcome, result.predecessor_id) == ("waiting", better)
    assert state(installed, better) == 1


def test_running_worse_priority_job_blocks_a_better_priority_newcomer(installed):
    running = new_job(installed, group="g", priority=5)
    claimed(installed, running)
    newcomer = new_job(installed, group="g", priority=1)
    result = claim(installed, newcomer)
    assert (result.outcome, result.predecessor_id) == ("waiting", running)
    assert processing_count(installed, "g") == 1


def test_jobs_without_a_group_never_wait(installed):
    first = new_job(installed)
    claimed(installed, first)
    second = new_job(installed)
    assert claim(installed, second).outcome == "claimed"


def test_waiting_head_with_nobody_running_is_claimed(installed):
    first = new_job(installed, group="g")
    second = new_job(installed, group="g")
    claimed(installed, first)
    assert claim(installed, second).outcome == "waiting"
    set_row(installed, first, state=3)  # its finish never ran (a crash)
    result = claim(installed, second, now=at(5))
    assert (result.outcome, result.attempt) == ("claimed", 1)


def test_claim_that_waits_behind_a_waiting_head_promotes_that_head(installed):
    """Nobody runs, the head is WAITING: the claim that finds it moves it to READY (no stuck group)."""
    first = new_job(installed, group="g")
    head = new_job(installed, group="g")
    late = new_job(installed, group="g")
    claimed(installed, first)
    assert claim(installed, head).outcome == "waiting"
    set_row(installed, first, state=3)  # its finish never ran (a crash)

    result = claim(installed, late, now=at(5))

    assert (result.outcome, result.predecessor_id, result.promoted_id) == ("waiting", head, head)
    assert states(installed, head, late) == [1, 6]
    assert row(installed, head)["error_message"] is None
    assert row(installed, head)["postponed_by"] is None


def test_waiting_write_never_clobbers_a_processing_row(installed):
    """A PROCESSING job with a better-priority job in its group: a stray claim must not make it WAIT."""
    running = new_job(installed, group="g", priority=2)
    claimed(installed, running, now=T0)
    better = new_job(installed, group="g", priority=1)
    before = row(installed, running)

    result = claim(installed, running, now=at(5))

    assert (result.outcome, result.state) == ("unexpected", 2)
    assert row(installed, running) == before
    assert state(installed, better) == 1


# --- redundant (UNIQUE) ---


@pytest.mark.parametrize("older_state", [-1, 1, 2, 3, 4, 5, 6, 7, 8])
def test_unique_job_with_an_older_row_of_its_identifier_in_any_state_is_redundant(installed, older_state):
    older = new_job(installed, identifier="report-42", mode="unique")
    set_row(installed, older, state=older_state)
    job = new_job(installed, identifier="report-42", mode="unique")

    result = claim(installed, job, now=at(7))

    assert (result.outcome, result.state, result.attempt) == ("redundant", 7, None)
    after = row(installed, job)
    assert after["state"] == 7
    assert after["finished_at"] == at(7)
    assert after["number_of_attempts"] == 0
    assert state(installed, older) == older_state


def test_older_row_of_a_sub_queue_counts_for_unique(installed):
    new_job(installed, queue="general_x", identifier="u", mode="normal")
    job = new_job(installed, identifier="u", mode="unique")
    assert claim(installed, job).outcome == "redundant"


def test_first_unique_job_runs_and_a_newer_duplicate_does_not_stop_it(installed):
    first = new_job(installed, identifier="u", mode="unique")
    new_job(installed, identifier="u", mode="unique")
    assert claim(installed, first).outcome == "claimed"


def test_unique_checks_only_its_identifier_and_its_queue(installed):
    new_job(installed, identifier="other-id", mode="unique")
    new_job(installed, queue="other", identifier="u", mode="unique")
    new_job(installed, identifier="U", mode="unique")  # identifiers compare byte-wise
    job = new_job(installed, identifier="u", mode="unique")
    assert claim(installed, job).outcome == "claimed"


@pytest.mark.dialect_differs(
    mysql="redundant", postgres="claimed", reason="utf8mb4_bin is a PAD SPACE collation: 'report ' = 'report'"
)
def test_unique_identifiers_compare_byte_wise_including_trailing_spaces(installed, dialect_expects):
    """schema.sql: identifiers compare byte-wise; 'report ' is not 'report' on PostgreSQL.

    Dialect exception (MySQL/MariaDB): utf8mb4_bin is a PAD SPACE collation, so 'report ' equals
    'report' there and the newer UNIQUE job is REDUNDANT. bgq's publish() refuses identifiers and
    group names that end in whitespace (tests/test_publish_validation.py), so the application
    cannot reach this case; only raw inserts can.
    """
    new_job(installed, identifier="report", mode="unique")
    job = new_job(installed, identifier="report ", mode="unique")
    assert claim(installed, job).outcome == dialect_expects


def test_normal_job_with_a_duplicate_identifier_is_not_redundant(installed):
    new_job(installed, identifier="u")
    job = new_job(installed, identifier="u", mode="normal")
    assert claim(installed, job).outcome == "claimed"


def test_redundant_grouped_job_wakes_the_waiting_head(installed):
    """A UNIQUE duplicate that was first in line of its group hands over to the WAITING head."""
    new_job(installed, identifier="u")  # the older row of the identifier
    blocker = new_job(installed, group="g")
    dup = new_job(installed, group="g", identifier="u", mode="unique", priority=1)
    waiter = new_job(installed, group="g", priority=2)
    claimed(installed, blocker)
    assert claim(installed, waiter).outcome == "waiting"
    set_row(installed, blocker, state=3)  # the blocker is done; dup is first in line now

    result = claim(installed, dup)

    assert (result.outcome, result.promoted_id) == ("redundant", waiter)
    assert states(installed, dup, waiter) == [7, 1]


# --- coalescing ---


def test_claim_coalesces_only_unstarted_jobs_of_its_group_with_a_threshold_at_least_its_own(installed):
    own = new_job(installed, group="g", threshold=150)
    same = new_job(installed, group="g", threshold=150)
    higher_waiting = new_job(installed, group="g", threshold=152)
    higher_failed = new_job(installed, group="g", threshold=151)
    higher_broker_failed = new_job(installed, group="g", threshold=400)
    higher_back = new_job(installed, group="g", threshold=160)
    lower = new_job(installed, group="g", threshold=149)
    no_threshold = new_job(installed, group="g", threshold=None)
    finished = new_job(installed, group="g", threshold=900)
    failed_for_good = new_job(installed, group="g", threshold=900)
    other_group = new_job(installed, group="h", threshold=900)
    other_group_running = new_job(installed, group="h2", threshold=900)
    set_row(installed, higher_waiting, state=6)
    set_row(installed, higher_failed, state=4)
    set_row(installed, higher_broker_failed, state=8)
    set_row(installed, higher_back, state=-1)
    set_row(installed, finished, state=3, finished_at=T0)
    set_row(installed, failed_for_good, state=5)
    claimed(installed, other_group_running)
    untouched = {
        j: row(installed, j)
        for j in (lower, no_threshold, finished, failed_for_good, other_group, other_group_running)
    }

    result = claim(installed, own, now=at(5))

    assert result.outcome == "claimed"
    for swallowed in (same, higher_waiting, higher_failed, higher_broker_failed, higher_back):
        after = row(installed, swallowed)
        assert (swallowed, after["state"]) == (swallowed, 7)
        assert after["finished_at"] == at(5)
    for job, before in untouched.items():
        assert row(installed, job) == before, job
    assert state(installed, own) == 2


def test_coalescing_is_skipped_when_the_claim_has_to_wait(installed):
    running = new_job(installed, group="g", threshold=900)
    claimed(installed, running)
    own = new_job(installed, group="g", threshold=100)
    later = new_job(installed, group="g", threshold=200)

    result = claim(installed, own)

    assert result.outcome == "waiting"
    assert states(installed, running, own, later) == [2, 6, 1]


def test_coalesced_waiting_head_leaves_the_group_heads(installed):
    blocker = new_job(installed, group="g", priority=1)
    waiter = new_job(installed, group="g", priority=1, threshold=20)
    claimed(installed, blocker)
    assert claim(installed, waiter).outcome == "waiting"
    assert group_row(installed, "g")["waiting_head_id"] == waiter
    own = new_job(installed, group="g", priority=0, threshold=10)
    set_row(installed, blocker, state=3)  # done; own is first in line by priority

    assert claim(installed, own, now=at(60)).outcome == "claimed"

    assert state(installed, waiter) == 7
    assert group_row(installed, "g")["waiting_head_id"] is None


def test_threshold_without_a_group_coalesces_nothing(installed):
    own = new_job(installed, threshold=10)
    other = new_job(installed, threshold=20)
    claimed(installed, own)
    assert state(installed, other) == 1


# --- two connections ---


@pytest.mark.parametrize("group", [None, "g"])
def test_same_id_claimed_by_two_transactions_at_once_is_claimed_once(installed, group):
    job = new_job(installed, group=group)

    outcomes = run_together(lambda: claim(installed, job), lambda: claim(installed, job))

    assert sorted(r.outcome for r in outcomes) == ["claimed", "unexpected"]
    assert row(installed, job)["number_of_attempts"] == 1


@pytest.mark.parametrize("group", [None, "g"])
def test_claim_of_a_job_being_claimed_waits_and_then_changes_nothing(installed, group):
    job = new_job(installed, group=group)
    with background() as run, held_transaction(installed) as conn_a:
        first = claim(installed, job, conn=conn_a)
        assert first.outcome == "claimed"
        second = run(claim, installed, job, pid=1, now=at(1))
        wait_for_lock_wait(installed)
        assert not second.done()
        conn_a.commit()
        result = second.result(timeout=30)
    assert (result.outcome, result.state) == ("unexpected", 2)
    after = row(installed, job)
    assert (after["number_of_attempts"], after["pid"], after["last_attempt_at"]) == (1, PID, T0)


@pytest.mark.parametrize("a_ends", ["commit", "rollback"])
def test_second_claimer_of_a_group_blocks_until_the_first_ends(installed, a_ends):
    """Thread A claims a job of g and holds its transaction; B's claim of another job of g blocks.

    After A commits, B must see A's PROCESSING job and wait (although B has the better priority);
    after A rolls back, B is first in line and runs.
    """
    job_b = new_job(installed, group="g", priority=1)
    job_a = new_job(installed, group="g", priority=2)
    set_row(installed, job_b, state=5)  # not in line while A claims
    with background() as run, held_transaction(installed) as conn_a:
        assert claim(installed, job_a, conn=conn_a).outcome == "claimed"
        set_row(installed, job_b, state=1)  # back in line (raw SQL takes no group lock)
        second = run(claim, installed, job_b)
        wait_for_lock_wait(installed)
        assert not second.done()
        if a_ends == "commit":
            conn_a.commit()
        else:
            conn_a.rollback()
        result = second.result(timeout=30)
    if a_ends == "commit":
        assert (result.outcome, result.predecessor_id) == ("waiting", job_a)
        assert states(installed, job_a, job_b) == [2, 6]
    else:
        assert result.outcome == "claimed"
        assert states(installed, job_a, job_b) == [1, 2]
    assert processing_count(installed, "g") == 1


def test_claims_of_different_groups_never_wait_for_each_other(installed):
    """The group lock is per group (checklist 55), also beside groups that ran jobs before.

    Groups whose jobs ran and finished leave old entries in the running_group index, which a
    long reader elsewhere keeps from being purged. On MySQL a UNIQUE index there took gap locks
    beside them in its duplicate check, so a claim of one group waited for the open claim
    transaction of another (migration 0007_running_group_key made it a plain index).
    """
    prefix = f"g-{uuid.uuid4().hex}"
    groups = [f"{prefix}-{i}" for i in range(5)]
    with old_snapshot(installed):  # a long reader elsewhere keeps old row versions
        for group in groups:
            earlier = new_job(installed, group=group)
            assert finish(installed, earlier, claimed(installed, earlier)).finished
        jobs = [new_job(installed, group=group) for group in groups]
        with background() as run, held_transaction(installed) as conn_a:
            assert claim(installed, jobs[1], conn=conn_a).outcome == "claimed"
            others = [run(claim, installed, job) for job in (jobs[0], jobs[2], jobs[4])]
            # Judged by these claims alone, not by any lock wait on the table (a full run once saw
            # another session's): each must end while the other group's claim is still open
            # (a claim that waited would end only at the commit, or 'locked' after GROUP_LOCK_WAIT_S).
            finished, _ = futures.wait(others, timeout=2.5)
            blocked = [other not in finished for other in others]
            conn_a.commit()
        results = [other.result(timeout=5) for other in others]
    assert blocked == [False, False, False], "claims of other groups waited for an open claim"
    assert [r.outcome for r in results] == ["claimed"] * 3
    assert states(installed, *jobs) == [2, 2, 2, 1, 2]


def test_group_lock_held_longer_than_its_wait_makes_the_claim_locked(installed):
    """A slow test (GROUP_LOCK_WAIT_S, 3 s, on the server's lock timer, which no test clock can
    move): B gives up on the group lock, changes nothing and leaks no setting."""
    job_a = new_job(installed, group="g")
    job_b = new_job(installed, group="g")
    before_b = row(installed, job_b)

    def claim_b():
        with installed.db.transaction() as conn:
            setting_before = lock_timeout_setting(installed, conn)
            started = time.monotonic()
            result = claim(installed, job_b, conn=conn, now=at(1))
            elapsed = time.monotonic() - started
            return result, elapsed, setting_before, lock_timeout_setting(installed, conn)

    with background() as run, held_transaction(installed) as conn_a:
        assert claim(installed, job_a, conn=conn_a).outcome == "claimed"
        result, elapsed, setting_before, setting_after = run(claim_b).result(timeout=60)
        conn_a.commit()

    assert result.outcome == "locked"
    assert result.attempt is None
    assert GROUP_LOCK_WAIT_S - 0.5 <= elapsed < GROUP_LOCK_WAIT_S + 17
    assert row(installed, job_b) == before_b
    assert states(installed, job_a, job_b) == [2, 1]
    assert setting_after == setting_before  # no session setting leaks into the pooled connection
    assert result.predecessor_id is None and result.promoted_id is None
