"""Contract of {table}_hand_off: a grouped job's result and its group's next head, in one transaction."""

from __future__ import annotations

import time

import pytest

import bgq
from bgq.model import JobResult
from tests.support.helpers import (
    PID,
    QUEUE,
    T0,
    at,
    background,
    blocked_or_done,
    claim_batch,
    claimed,
    finish,
    finish_batch,
    group_row,
    hand_off,
    held_transaction,
    new_job,
    processing_count,
    procs,
    row,
    run_together,
    set_row,
    state,
    states,
)


def ids(result):
    return [c.id for c in result]


def _running(installed, job_id, now=T0):
    """Claim `job_id` (a group's head) with claim_batch; its attempt token."""
    (got,) = claim_batch(installed, 1, now=now)
    assert got.id == job_id
    return got.claim.attempt


# --- the result, then the group's next head ---


def test_the_result_is_written_and_the_groups_next_head_claimed(installed):
    a = new_job(installed, group="g", priority=1)
    b = new_job(installed, group="g", priority=1)
    c = new_job(installed, group="g", priority=2)
    other_head = new_job(installed, group="h", priority=0)
    loner = new_job(installed, priority=0)
    attempt = claimed(installed, a, now=T0)
    others = {j: row(installed, j) for j in (c, other_head, loner)}

    written, got = hand_off(
        installed, "g", [JobResult(a, attempt, 3, execution_time=5)], pid=77, worker_id=12, now=at(3)
    )

    assert written == {a: True}
    assert [(j.id, j.claim.attempt, j.claim.serial_group, j.claim.outcome) for j in got] == [
        (b, 1, "g", "claimed")
    ]
    done = row(installed, a)
    assert (done["state"], done["finished_at"], done["execution_time"]) == (3, at(3), 5)
    head = row(installed, b)
    assert (head["state"], head["pid"], head["worker_id"], head["last_attempt_at"]) == (2, 77, 12, at(3))
    assert {j: row(installed, j) for j in (c, other_head, loner)} == others


def test_without_results_only_that_groups_head_is_claimed(installed):
    a = new_job(installed, group="g", priority=1)
    b = new_job(installed, group="g", priority=1)
    other_head = new_job(installed, group="h", priority=0)
    loner = new_job(installed, priority=0)

    written, first = hand_off(installed, "g")
    assert (written, ids(first)) == ({}, [a])
    assert states(installed, b, other_head, loner) == [1, 1, 1]

    assert hand_off(installed, "g") == ({}, [])  # the group runs a job
    assert state(installed, b) == 1
    assert finish(installed, a, first[0].claim.attempt, 3, now=at(1)).finished
    assert ids(hand_off(installed, "g", now=at(2))[1]) == [b]
    assert states(installed, other_head, loner) == [1, 1]


@pytest.mark.parametrize("kind", ["group", "queue"])
def test_a_paused_group_or_queue_is_not_handed_on_until_resumed(installed, kind):
    a = new_job(installed, group="g")
    b = new_job(installed, group="g")
    attempt = claimed(installed, a, now=T0)
    name = "g" if kind == "group" else QUEUE
    with installed.db.transaction() as conn:
        assert procs(installed).pause(conn, kind, name, "maintenance", "ada")
    written, got = hand_off(installed, "g", [JobResult(a, attempt, 3, execution_time=5)], now=at(1))
    assert (written[a], ids(got)) == (True, [])  # the result is written; the paused head stays
    assert states(installed, a, b) == [3, 1]
    with installed.db.transaction() as conn:
        assert procs(installed).resume(conn, kind, name)
    assert ids(hand_off(installed, "g", now=at(2))[1]) == [b]


@pytest.mark.parametrize(
    "case", ["not-due", "other-queue", "below-min-priority", "back-to-broker", "unknown"]
)
def test_nothing_is_claimed_when_the_head_is_not_claimable_here(installed, case):
    """Order inside a group never bends: the job after the head is not claimed in its place."""
    head = new_job(installed, group="g", priority=2, queue="other" if case == "other-queue" else QUEUE)
    nxt = new_job(installed, group="g", priority=2)
    if case == "not-due":
        set_row(installed, head, state=4, number_of_attempts=1, last_attempt_at=T0, postponed_by=60000)
    elif case == "back-to-broker":
        set_row(installed, head, state=-1)
    elif case == "below-min-priority":
        set_row(installed, head, priority=1)
    before = {j: row(installed, j) for j in (head, nxt)}

    result = hand_off(installed, "nope" if case == "unknown" else "g", min_priority=2, now=at(30))

    assert result == ({}, [])
    assert {j: row(installed, j) for j in (head, nxt)} == before


def test_a_head_of_a_sub_queue_is_claimed(installed):
    head = new_job(installed, group="g", queue="general_x")
    _, got = hand_off(installed, "g")
    assert [(c.id, c.claim.queue) for c in got] == [(head, "general_x")]


def test_a_waiting_head_is_promoted_by_the_result_and_claimed(installed):
    first = new_job(installed, group="g")
    waiter = new_job(installed, group="g")
    attempt = claimed(installed, first)
    set_row(installed, waiter, state=6, error_message=f"Waiting for job ID {first}", postponed_by=1500)

    written, got = hand_off(installed, "g", [JobResult(first, attempt, 5, error="no")], now=at(1))

    assert (written, ids(got)) == ({first: True}, [waiter])
    after = row(installed, waiter)
    assert (after["state"], after["error_message"], after["postponed_by"]) == (2, None, None)
    assert group_row(installed, "g")["waiting_head_id"] is None


def test_a_temporary_failure_hands_on_to_the_same_job_only_once_it_is_due(installed):
    job = new_job(installed, group="g")
    nxt = new_job(installed, group="g")
    attempt = claimed(installed, job, now=T0)

    written, got = hand_off(installed, "g", [JobResult(job, attempt, 4, postponed_by=60000)], now=at(1))

    assert (written, got) == ({job: True}, [])  # the failed job is still first in line, not due
    assert states(installed, job, nxt) == [4, 1]
    assert ids(hand_off(installed, "g", now=at(60))[1]) == [job]


# --- several groups in one call ---


def test_several_groups_results_are_written_and_each_groups_next_head_claimed(installed):
    firsts = {g: new_job(installed, group=g, priority=1) for g in ("a", "b", "c")}
    nexts = {g: new_job(installed, group=g, priority=p) for g, p in (("a", 2), ("b", 1), ("c", 3))}
    kept_out = new_job(installed, group="d")
    loner = new_job(installed, priority=0)
    attempts = {c.id: c.claim.attempt for c in claim_batch(installed, 10, now=T0)}
    assert sorted(attempts) == sorted([*firsts.values(), kept_out, loner])
    results = [JobResult(j, attempts[j], 3, execution_time=1) for j in (*firsts.values(), loner)]

    written, got = hand_off(installed, ["c", "a", "b"], results, pid=5, worker_id=8, now=at(2))

    assert written == {j: True for j in (*firsts.values(), loner)}
    # One head per group, in (priority, id) order across the groups.
    assert ids(got) == [nexts["b"], nexts["a"], nexts["c"]]
    assert [c.claim.serial_group for c in got] == ["b", "a", "c"]
    for head in nexts.values():
        r = row(installed, head)
        assert (r["state"], r["pid"], r["worker_id"], r["last_attempt_at"]) == (2, 5, 8, at(2))
    assert states(installed, *firsts.values(), loner, kept_out) == [3, 3, 3, 3, 2]


def test_a_group_listed_without_a_written_result_is_claimed_only_once_free(installed):
    """A group whose result is fenced out (its job runs under another claim) keeps running; the
    other groups of the call are handed on."""
    a1, a2 = new_job(installed, group="a"), new_job(installed, group="a")
    b1, b2 = new_job(installed, group="b"), new_job(installed, group="b")
    attempts = {c.id: c.claim.attempt for c in claim_batch(installed, 10, now=T0)}
    results = [JobResult(a1, attempts[a1] + 1, 3), JobResult(b1, attempts[b1], 3)]

    written, got = hand_off(installed, ["a", "b"], results, now=at(1))

    assert (written, ids(got)) == ({a1: False, b1: True}, [b2])
    assert states(installed, a1, a2, b1, b2) == [2, 1, 3, 2]


def test_a_group_whose_row_another_transaction_holds_is_left_alone_and_the_others_handed_on(installed):
    a1, a2 = new_job(installed, group="a"), new_job(installed, group="a")
    b1, b2 = new_job(installed, group="b"), new_job(installed, group="b")
    attempts = {c.id: c.claim.attempt for c in claim_batch(installed, 10, now=T0)}
    assert finish(installed, a1, attempts[a1], 3, now=at(1)).finished
    with held_transaction(installed) as conn_a:  # a claim or a finish of group a, say
        conn_a.exec_driver_sql(
            f"SELECT serial_group FROM {installed.table}_group WHERE serial_group = 'a' FOR UPDATE"
        ).all()
        started = time.monotonic()
        written, got = hand_off(installed, ["a", "b"], [JobResult(b1, attempts[b1], 3)], now=at(2))
        elapsed = time.monotonic() - started
        conn_a.rollback()
    assert (written, ids(got)) == ({b1: True}, [b2])
    assert elapsed < 1.5  # a wait for group a's row would take the 3 s lock timeout
    assert states(installed, a2, b2) == [1, 2]
    assert ids(hand_off(installed, ["a"], now=at(3))[1]) == [a2]


def test_results_of_every_kind_are_written_as_finish_batch_writes_them_and_the_heads_claimed(installed):
    """A batch with failures, a copy and a plain result goes the long way (finish_results) for all
    of them; each group is still handed on where its head is claimable."""
    jobs = {g: new_job(installed, group=g) for g in ("ok", "temp", "perm", "wait")}
    nexts = {g: new_job(installed, group=g) for g in jobs}
    attempts = {c.id: c.claim.attempt for c in claim_batch(installed, 10, now=T0)}
    results = [
        JobResult(jobs["ok"], attempts[jobs["ok"]], 3),
        JobResult(jobs["temp"], attempts[jobs["temp"]], 4, error="later", postponed_by=60000),
        JobResult(jobs["perm"], attempts[jobs["perm"]], 5, error="bad"),
        JobResult(jobs["wait"], attempts[jobs["wait"]], 3, clone_delay_ms=60000),
    ]

    written, got = hand_off(installed, list(jobs), results, now=at(1))

    assert written == {j: True for j in jobs.values()}
    # The temporarily failed job is its group's head again, not due: that group waits.
    assert sorted(ids(got)) == sorted(nexts[g] for g in ("ok", "perm", "wait"))
    assert states(installed, *jobs.values()) == [3, 4, 5, 3]
    assert state(installed, nexts["temp"]) == 1
    copies = installed.sql("SELECT state, postponed_by FROM {t} WHERE id > %s", (max(nexts.values()),))
    assert [(r["state"], r["postponed_by"]) for r in copies] == [(1, 60000)]


def test_a_waiting_job_is_woken_in_a_batch_of_plain_results(installed):
    a1, a2 = new_job(installed, group="a"), new_job(installed, group="a")
    b1, b_waiter = new_job(installed, group="b"), new_job(installed, group="b")
    attempts = {c.id: c.claim.attempt for c in claim_batch(installed, 10, now=T0)}
    set_row(installed, b_waiter, state=6, error_message=f"Waiting for job ID {b1}", postponed_by=1500)

    written, got = hand_off(
        installed, ["a", "b"], [JobResult(a1, attempts[a1], 3), JobResult(b1, attempts[b1], 3)], now=at(1)
    )

    assert written == {a1: True, b1: True}
    assert ids(got) == [a2, b_waiter]
    waiter = row(installed, b_waiter)
    assert (waiter["state"], waiter["error_message"], waiter["postponed_by"]) == (2, None, None)
    assert group_row(installed, "b")["waiting_head_id"] is None


def test_groups_without_a_row_yet_and_repeated_names_are_claimed_once(installed):
    heads = {g: new_job(installed, group=g) for g in ("x", "y")}
    assert group_row(installed, "x") is None

    written, got = hand_off(installed, ["y", "x", "y"], now=at(1))

    assert (written, sorted(ids(got))) == ({}, sorted(heads.values()))
    assert group_row(installed, "x") is not None
    assert processing_count(installed, "x") == processing_count(installed, "y") == 1


def test_an_empty_list_of_groups_only_writes_the_results(installed):
    a1, a2 = new_job(installed, group="a"), new_job(installed, group="a")
    loner = new_job(installed)
    attempts = {c.id: c.claim.attempt for c in claim_batch(installed, 10, now=T0)}

    written, got = hand_off(
        installed, [], [JobResult(a1, attempts[a1], 3), JobResult(loner, attempts[loner], 3)], now=at(1)
    )

    assert (written, got) == ({a1: True, loner: True}, [])
    assert states(installed, a1, a2, loner) == [3, 1, 3]


# --- fencing and exclusion ---


@pytest.mark.parametrize("token_offset", [-1, 1])
def test_a_fenced_out_result_changes_nothing_and_claims_nothing_while_the_group_runs(installed, token_offset):
    a = new_job(installed, group="g")
    b = new_job(installed, group="g")
    attempt = claimed(installed, a)
    before = {j: row(installed, j) for j in (a, b)}

    result = hand_off(installed, "g", [JobResult(a, attempt + token_offset, 3)], now=at(1))

    assert result == ({a: False}, [])
    assert {j: row(installed, j) for j in (a, b)} == before


def test_a_reaped_and_reclaimed_job_cannot_be_handed_off_by_its_old_token(installed):
    a = new_job(installed, group="g")
    b = new_job(installed, group="g")
    old_token = claimed(installed, a, now=T0)
    with installed.db.transaction() as conn:
        assert [r.id for r in procs(installed).reap(conn, QUEUE, 60, 10, at(61))] == [a]
    new_token = claimed(installed, a, pid=5151, now=at(62))
    before = {j: row(installed, j) for j in (a, b)}

    assert hand_off(installed, "g", [JobResult(a, old_token, 3)], now=at(63)) == ({a: False}, [])

    assert {j: row(installed, j) for j in (a, b)} == before
    assert ids(hand_off(installed, "g", [JobResult(a, new_token, 3)], now=at(64))[1]) == [b]


def test_two_concurrent_hand_offs_of_one_group_claim_its_head_once(installed):
    for _ in range(3):
        installed.clear()
        heads = [new_job(installed, group="g") for _ in range(3)]

        got = run_together(lambda: hand_off(installed, "g", pid=1), lambda: hand_off(installed, "g", pid=2))

        claimed_ids = [c.id for _, jobs in got for c in jobs]
        assert claimed_ids == [heads[0]]
        assert states(installed, *heads) == [2, 1, 1]
        assert installed.sql("SELECT COUNT(*) AS n FROM {t} WHERE state = 2")[0]["n"] == 1


def test_the_result_and_the_claim_commit_together(installed):
    """Until the hand-off commits, nobody sees its result or claims the head; a rollback undoes both."""
    a = new_job(installed, group="g")
    b = new_job(installed, group="g")
    attempt = claimed(installed, a)
    with background() as run, held_transaction(installed) as conn:
        written, got = hand_off(installed, "g", [JobResult(a, attempt, 3)], conn=conn, now=at(1))
        assert (written, ids(got)) == ({a: True}, [b])
        future = run(claim_batch, installed, 10, pid=9, now=at(2))  # the group row is held: skipped
        blocked = blocked_or_done(installed, future)
        conn.rollback()
        other = future.result(timeout=60)
    assert not blocked, "a claim waited for the hand-off's group row"
    assert other == []
    assert states(installed, a, b) == [2, 1]
    assert row(installed, a)["number_of_attempts"] == attempt


def test_a_group_row_another_transaction_holds_is_not_waited_for(installed):
    """The results are written; the head whose group row is held elsewhere is left alone at once."""
    loner = new_job(installed)
    head = new_job(installed, group="g")
    (got,) = claim_batch(installed, 1, now=T0)
    assert got.id == loner
    installed.sql("INSERT INTO {t}_group (serial_group, updated_at) VALUES ('g', %s)", (T0,))
    with held_transaction(installed) as conn_a:  # a claim or a finish of g, say
        conn_a.exec_driver_sql(
            f"SELECT serial_group FROM {installed.table}_group WHERE serial_group = 'g' FOR UPDATE"
        ).all()
        started = time.monotonic()
        result = hand_off(installed, "g", [JobResult(loner, got.claim.attempt, 3)], now=at(1))
        elapsed = time.monotonic() - started
        conn_a.rollback()
    assert result == ({loner: True}, [])
    assert elapsed < 1.5  # a wait for the group row would take the 3 s lock timeout
    assert states(installed, loner, head) == [3, 1]


# --- copies: RECURRING and WaitingException, as every writer makes them ---


def test_a_finished_recurring_job_leaves_its_successor_and_the_next_head_is_claimed(installed):
    recurring = new_job(installed, group="g", identifier="nightly", mode="recurring")
    nxt = new_job(installed, group="g")
    attempt = _running(installed, recurring)

    written, got = hand_off(
        installed, "g", [JobResult(recurring, attempt, 3, clone_delay_ms=60000)], now=at(1)
    )

    assert (written, ids(got)) == ({recurring: True}, [nxt])
    assert row(installed, recurring) is None  # one row per identifier remains
    (successor,) = installed.sql("SELECT * FROM {t} WHERE identifier = 'nightly'")
    assert (successor["state"], successor["postponed_by"], successor["serial_group"]) == (1, 60000, "g")
    assert successor["id"] > nxt


def test_a_copy_that_is_not_due_yet_is_not_claimed(installed):
    job = new_job(installed, group="g")
    attempt = _running(installed, job)

    written, got = hand_off(installed, "g", [JobResult(job, attempt, 3, clone_delay_ms=60000)], now=at(1))

    assert (written, got) == ({job: True}, [])
    rows = installed.sql("SELECT id, state, postponed_by FROM {t} ORDER BY id")
    assert [(r["state"], r["postponed_by"]) for r in rows] == [(3, None), (1, 60000)]
    assert ids(hand_off(installed, "g", now=at(61))[1]) == [rows[1]["id"]]


# --- errors: nothing written ---


def _fails_even_if_committed(installed, results, group):
    """The call fails; the caller commits anyway (MySQL keeps a failed CALL's earlier writes)."""
    with held_transaction(installed) as conn:
        with pytest.raises(bgq.DatabaseError) as caught:  # translated at the call seam
            groups = [group] if isinstance(group, str) else group
            procs(installed).hand_off(conn, results, groups, QUEUE, PID, None, None, 1500, at(9))
        conn.commit()
    return caught.value


def test_groups_that_are_not_a_json_array_raise_and_write_nothing(installed):
    job = new_job(installed, group="g")
    attempt = claimed(installed, job)
    before = row(installed, job)
    results = [JobResult(job, attempt, 3)]

    with pytest.raises(bgq.DatabaseError) as caught:
        hand_off(installed, None, results)
    assert type(caught.value) is bgq.DatabaseError
    assert "hand_off needs a JSON array of groups" in str(caught.value)
    assert type(_fails_even_if_committed(installed, results, None)) is bgq.DatabaseError

    assert row(installed, job) == before


@pytest.mark.parametrize("case", ["bad-state", "recurring-without-copy"])
def test_a_bad_result_raises_and_neither_writes_nor_claims(installed, case):
    recurring = case == "recurring-without-copy"
    job = new_job(
        installed,
        group="g",
        identifier="r" if recurring else None,
        mode="recurring" if recurring else "normal",
    )
    other = new_job(installed, group="h")
    nxt = new_job(installed, group="h")
    attempts = {c.id: c.claim.attempt for c in claim_batch(installed, 10)}
    assert sorted(attempts) == [job, other]
    results = [JobResult(other, attempts[other], 3), JobResult(job, attempts[job], 3 if recurring else 2)]
    before = {j: row(installed, j) for j in (job, other, nxt)}

    with pytest.raises(bgq.DatabaseError) as caught:
        hand_off(installed, "h", results, now=at(1))
    assert type(caught.value) is bgq.DatabaseError
    expected = "needs clone_delay_ms" if recurring else "a result state must be 1, 3, 4, 5 or 7"
    assert expected in str(caught.value)
    assert type(_fails_even_if_committed(installed, results, "h")) is bgq.DatabaseError

    assert {j: row(installed, j) for j in (job, other, nxt)} == before


# --- the short way (one FINISHED result, a plain next head) and the long way agree ---

_WRITTEN = (
    "state",
    "number_of_attempts",
    "error_message",
    "postponed_by",
    "execution_time",
    "memory",
    "finished_at",
    "updated_at",
    "pid",
    "metadata",
    "worker_id",
)


@pytest.mark.parametrize("memory", [None, {"rss": 12, "peak": [1, 2]}], ids=["no-memory", "memory"])
def test_a_finished_result_is_stored_as_finish_batch_stores_it(installed, memory):
    a = new_job(installed, group="g")
    new_job(installed, group="g")
    b = new_job(installed, group="h")
    attempts = {c.id: c.claim.attempt for c in claim_batch(installed, 10)}
    result = {"error": "note", "postponed_by": 5, "execution_time": 7, "memory": memory}

    written, got = hand_off(installed, "g", [JobResult(a, attempts[a], 3, **result)], now=at(2))
    assert finish_batch(installed, [JobResult(b, attempts[b], 3, **result)], now=at(2)) == {b: True}

    assert written == {a: True} and len(got) == 1
    assert {k: row(installed, a)[k] for k in _WRITTEN} == {k: row(installed, b)[k] for k in _WRITTEN}


@pytest.mark.parametrize("case", ["unique-redundant", "coalescing", "waiting-behind"])
def test_a_head_that_needs_the_long_way_is_claimed_as_claim_job_claims_it(installed, case):
    """A UNIQUE head with an older row of its identifier turns REDUNDANT and is not claimed; a
    head with a coalescing threshold coalesces the group's later jobs; a group with a WAITING job
    is woken. The result is written either way."""
    if case == "unique-redundant":
        new_job(installed, identifier="u", mode="unique")  # the older row of the identifier
    a = new_job(installed, group="g")
    attempt = claimed(installed, a, now=T0)
    if case == "unique-redundant":
        head = new_job(installed, group="g", identifier="u", mode="unique")
    else:
        head = new_job(installed, group="g", threshold=3 if case == "coalescing" else None)
    later = new_job(installed, group="g", threshold=5 if case == "coalescing" else None)
    if case == "waiting-behind":
        set_row(installed, later, state=6)

    written, got = hand_off(installed, "g", [JobResult(a, attempt, 3)], now=at(1))

    assert written == {a: True} and state(installed, a) == 3
    if case == "unique-redundant":
        assert (ids(got), state(installed, head)) == ([], 7)
    elif case == "coalescing":
        assert (ids(got), states(installed, head, later)) == ([head], [2, 7])
    else:
        assert (ids(got), states(installed, head, later)) == ([head], [2, 6])
        assert group_row(installed, "g")["waiting_head_id"] == later  # the wake recorded it


def test_a_result_of_another_group_is_written_and_this_groups_head_claimed(installed):
    a = new_job(installed, group="g")
    g_next = new_job(installed, group="g")
    h = new_job(installed, group="h")
    attempts = {c.id: c.claim.attempt for c in claim_batch(installed, 10)}
    assert sorted(attempts) == [a, h]

    written, got = hand_off(installed, "h", [JobResult(a, attempts[a], 3)], now=at(1))

    assert written == {a: True}
    assert (ids(got), states(installed, a, g_next, h)) == ([], [3, 1, 2])
    assert ids(hand_off(installed, "g", now=at(2))[1]) == [g_next]
