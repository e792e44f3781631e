"""Contract of {table}_claim_batch: order, limit, heads of idle groups, bounds, UNIQUE, coalescing, races.

The hand-off to one group's next head is {table}_hand_off (test_hand_off.py)."""

from __future__ import annotations

import json
import time

import pytest

import bgq
from bgq.sql.install import GROUP_LOCK_WAIT_S
from tests.support.helpers import (
    PID,
    QUEUE,
    T0,
    at,
    background,
    blocked_or_done,
    claim,
    claim_batch,
    claimed,
    group_row,
    held_transaction,
    lock_timeout_setting,
    new_job,
    procs,
    row,
    run_together,
    set_row,
    state,
    states,
    wait_for_lock_wait,
)


def ids(result):
    return [c.id for c in result]


def pytest_generate_tests(metafunc):
    """Every test twice (fixture groups_known): with groups that have no row in {table}_group yet
    (their heads are claimed through {table}_claim_job, which creates it) and with groups that
    have one (a plain head takes the short way under the locked row, as in a worker's every claim
    after its group's first). Tests about a group's first claim run once."""
    first_only = metafunc.definition.get_closest_marker("new_groups_only") is not None
    params = ["new-groups"] if first_only else ["new-groups", "known-groups"]
    metafunc.parametrize("groups_known", params, indirect=True)


@pytest.fixture(autouse=True)
def groups_known(request, monkeypatch):
    """known-groups: new_job gives each new group its row in {table}_group at once."""
    if request.param == "known-groups":
        real = new_job

        def known(installed, **kwargs):
            job_id = real(installed, **kwargs)
            group = kwargs.get("group")
            if group is not None and group_row(installed, group) is None:
                installed.sql("INSERT INTO {t}_group (serial_group, updated_at) VALUES (%s, %s)", (group, T0))
            return job_id

        monkeypatch.setitem(globals(), "new_job", known)
    return request.param


def _postpone(installed, job_id, **columns):
    """A job that ran at T0 and may run again 60 s later (due from at(60) on)."""
    set_row(installed, job_id, last_attempt_at=T0, postponed_by=60000, **columns)


# --- ungrouped jobs: order, limit, the claim's writes ---


def test_ungrouped_due_jobs_are_claimed_in_priority_then_id_order_up_to_the_limit(installed):
    a = new_job(installed, priority=2)
    b = new_job(installed, priority=1)
    c = new_job(installed, priority=1)
    d = new_job(installed, priority=3)

    result = claim_batch(installed, 3)

    assert ids(result) == [b, c, a]
    assert states(installed, a, b, c, d) == [2, 2, 2, 1]
    assert ids(claim_batch(installed, 3)) == [d]
    assert claim_batch(installed, 3) == []


@pytest.mark.parametrize(
    ("group", "mode"),
    [(None, "normal"), ("g", "normal"), (None, "unique")],
    ids=["ungrouped", "group-head", "unique"],
)
def test_claim_writes_the_claim_and_returns_the_job_as_stored(installed, group, mode):
    """The same writes on every path: the one-UPDATE path (ungrouped) and claim_job (head, UNIQUE)."""
    job = new_job(
        installed, priority=2, group=group, identifier="id-1", mode=mode, callback="cb2",
        parameters_json='{"a": [1, "x"]}',
    )  # fmt: skip
    set_row(
        installed, job, state=4, number_of_attempts=3, postponed_by=1000, error_message="boom",
        metadata='{"old": true}', pid=1,
    )  # fmt: skip
    before = row(installed, job)

    result = claim_batch(installed, 5, pid=PID, now=at(5))

    assert ids(result) == [job]
    got = result[0].claim
    assert (got.outcome, got.attempt, got.state) == ("claimed", 4, 2)
    assert (got.callback_name, got.queue, got.priority) == ("cb2", QUEUE, 2)
    assert (got.serial_group, got.identifier, got.mode, got.coalesce_threshold) == (group, "id-1", mode, None)
    parameters = got.parameters_json
    if isinstance(parameters, str):  # MySQL returns JSON as text, psycopg parses it
        parameters = json.loads(parameters)
    assert parameters == {"a": [1, "x"]}
    assert got.parameters is None
    after = row(installed, job)
    assert (after["state"], after["number_of_attempts"], after["pid"]) == (2, 4, PID)
    assert after["last_attempt_at"] == at(5)
    assert after["updated_at"] == at(5)
    assert (after["postponed_by"], after["error_message"], after["metadata"]) == (None, None, None)
    assert after["created_at"] == before["created_at"]
    assert after["finished_at"] is None


@pytest.mark.parametrize(
    ("group", "mode"),
    [(None, "normal"), ("g", "normal"), (None, "unique")],
    ids=["ungrouped", "group-head", "unique"],
)
def test_each_claim_stores_its_worker_id_and_a_claim_without_one_stores_null(installed, group, mode):
    """worker_id on both claim paths (the one-UPDATE path and claim_job), overwritten by every claim."""
    job = new_job(installed, group=group, identifier="id-1", mode=mode)
    other = new_job(installed, group=None if group is None else "h")
    assert row(installed, job)["worker_id"] is None

    assert ids(claim_batch(installed, 1, worker_id=7_000_000_000)) == [job]  # a BIGINT
    assert row(installed, job)["worker_id"] == 7_000_000_000
    assert row(installed, other)["worker_id"] is None  # not claimed: not written

    set_row(installed, job, state=4)  # reaped, say: claimable again
    assert ids(claim_batch(installed, 1, worker_id=8, now=at(1))) == [job]
    assert row(installed, job)["worker_id"] == 8
    set_row(installed, job, state=4)
    assert ids(claim_batch(installed, 1, now=at(2))) == [job]
    assert row(installed, job)["worker_id"] is None


@pytest.mark.parametrize("group", [None, "g"])
@pytest.mark.parametrize("from_state", [1, 4, 6, 8])
def test_every_due_claimable_state_is_claimed(installed, from_state, group):
    job = new_job(installed, group=group)
    set_row(installed, job, state=from_state, number_of_attempts=2)
    result = claim_batch(installed)
    assert [(c.id, c.claim.attempt) for c in result] == [(job, 3)]
    assert state(installed, job) == 2


@pytest.mark.parametrize("other_state", [-1, 2, 3, 5, 7])
def test_jobs_in_other_states_are_not_claimed(installed, other_state):
    """BACK_TO_BROKER waits for its message; PROCESSING, FINISHED, PERMANENTLY_FAILED, REDUNDANT never run."""
    job = new_job(installed)
    set_row(installed, job, state=other_state, number_of_attempts=1)
    before = row(installed, job)
    assert claim_batch(installed) == []
    assert row(installed, job) == before


@pytest.mark.parametrize("group", [None, "g"])
def test_a_job_whose_postponement_has_not_passed_is_claimed_only_when_due(installed, group):
    job = new_job(installed, group=group)
    _postpone(installed, job, state=4, number_of_attempts=1, error_message="SMTP down")
    before = row(installed, job)

    assert claim_batch(installed, now=at(59)) == []
    assert row(installed, job) == before

    result = claim_batch(installed, now=at(60))
    assert [(c.id, c.claim.attempt) for c in result] == [(job, 2)]
    after = row(installed, job)
    assert (after["state"], after["postponed_by"], after["error_message"]) == (2, None, None)


# --- serial groups: only the head of an idle group ---


def test_only_the_head_of_a_group_is_claimed_and_the_others_are_untouched(installed):
    worse = new_job(installed, group="g", priority=2)
    head = new_job(installed, group="g", priority=1)
    later = new_job(installed, group="g", priority=1)
    before = {j: row(installed, j) for j in (worse, later)}

    assert ids(claim_batch(installed, 10)) == [head]

    assert {j: row(installed, j) for j in (worse, later)} == before  # not WAITING: never candidates
    assert claim_batch(installed, 10) == []  # the group runs its head now


def test_a_group_with_a_processing_job_is_skipped(installed):
    running = new_job(installed, group="g", priority=5)
    claimed(installed, running)
    newcomer = new_job(installed, group="g", priority=1)
    loner = new_job(installed, priority=9)

    assert ids(claim_batch(installed, 10)) == [loner]
    assert states(installed, running, newcomer) == [2, 1]


# More claimable grouped jobs than the claim's first scan reads (4 * (2 * 1 + 2) + 16 = 32 for
# limit 1), all ahead of the only claimable head: it is found by the pass over every group.
SCAN_1 = 32


def _jobs(installed, count, **columns):
    return [new_job(installed, **columns) for _ in range(count)]


def test_a_head_behind_more_jobs_of_busy_groups_than_the_first_scan_reads_is_claimed(installed):
    running = new_job(installed, group="busy", priority=0)
    claimed(installed, running)
    queued = _jobs(installed, SCAN_1 + 6, group="busy", priority=0)
    other = new_job(installed, group="other-busy", priority=0)
    claimed(installed, other)
    _jobs(installed, 3, group="other-busy", priority=0)
    idle_head = new_job(installed, group="idle", priority=1)
    idle_next = new_job(installed, group="idle", priority=1)

    assert ids(claim_batch(installed, 1, max_heads=1)) == [idle_head]
    assert states(installed, queued[0], queued[-1], idle_next) == [1, 1, 1]


@pytest.mark.parametrize("case", ["back-to-broker", "other-queue"])
def test_jobs_behind_an_unclaimable_head_are_never_claimed_however_many(installed, case):
    """The first scan reads only jobs of group g that are not its head (its head is in state -1
    or in another queue): none of them may be claimed, however far the claim looks."""
    head = new_job(installed, group="g", priority=0, queue="other" if case == "other-queue" else QUEUE)
    if case == "back-to-broker":
        set_row(installed, head, state=-1)
    behind = _jobs(installed, SCAN_1 + 6, group="g", priority=0)
    last = new_job(installed, group="h", priority=1)

    assert ids(claim_batch(installed, 1, max_heads=1)) == [last]
    assert ids(claim_batch(installed, 1, max_heads=1)) == []
    assert set(states(installed, *behind)) == {1}


def test_the_first_scan_takes_heads_in_priority_then_id_order_past_non_heads(installed):
    """Within the first scan: a group's later jobs are skipped, the next groups' heads taken."""
    a = _jobs(installed, 3, group="a", priority=0)
    b = _jobs(installed, 2, group="b", priority=0)
    c = new_job(installed, group="c", priority=1)
    first = claim_batch(installed, 2, max_heads=2)
    assert ids(first) == [a[0], b[0]]
    assert ids(claim_batch(installed, 2, max_heads=2)) == [c]


@pytest.mark.parametrize("done_state", [3, 5, 7])
def test_finished_and_failed_jobs_do_not_head_their_group(installed, done_state):
    old = new_job(installed, group="g", priority=0)
    set_row(installed, old, state=done_state)
    nxt = new_job(installed, group="g", priority=1)
    assert ids(claim_batch(installed, 10)) == [nxt]
    assert state(installed, old) == done_state


@pytest.mark.parametrize("case", ["not-due", "other-queue", "below-min-priority", "back-to-broker"])
def test_a_group_whose_head_is_not_claimable_here_is_skipped_as_a_whole(installed, case):
    """Order inside a group never bends: the job after the head is not claimed in its place."""
    head = new_job(installed, group="g", priority=2, queue="other" if case == "other-queue" else QUEUE)
    nxt = new_job(installed, group="g", priority=2)
    loner = new_job(installed, priority=2)
    if case == "not-due":
        _postpone(installed, head, state=4, number_of_attempts=1)
    elif case == "back-to-broker":
        set_row(installed, head, state=-1)
    elif case == "below-min-priority":
        set_row(installed, head, priority=1)
    before = {j: row(installed, j) for j in (head, nxt)}

    result = claim_batch(installed, 10, min_priority=2, now=at(30))

    assert ids(result) == [loner]
    assert {j: row(installed, j) for j in (head, nxt)} == before


def test_waiting_head_of_an_idle_group_is_claimed(installed):
    first = new_job(installed, group="g")
    waiter = new_job(installed, group="g")
    claimed(installed, first)
    assert claim(installed, waiter).outcome == "waiting"
    set_row(installed, first, state=3)  # its finish never ran (a crash)

    result = claim_batch(installed, 10, now=at(5))

    assert [(c.id, c.claim.attempt) for c in result] == [(waiter, 1)]
    after = row(installed, waiter)
    assert (after["state"], after["error_message"], after["postponed_by"]) == (2, None, None)
    assert group_row(installed, "g")["waiting_head_id"] is None


def test_one_head_per_group_and_the_limit_counts_heads_and_ungrouped_jobs_together(installed):
    a = new_job(installed, group="g1", priority=1)
    b = new_job(installed, group="g1", priority=1)
    c = new_job(installed, group="g2", priority=2)
    u1 = new_job(installed, priority=1)
    d = new_job(installed, group="g3", priority=0)
    u2 = new_job(installed, priority=3)

    assert ids(claim_batch(installed, 3)) == [d, a, u1]
    assert states(installed, b, c, u2) == [1, 1, 1]
    assert ids(claim_batch(installed, 10)) == [c, u2]
    assert state(installed, b) == 1
    assert claim_batch(installed, 10) == []


def test_limit_one_takes_the_best_of_heads_and_ungrouped_jobs(installed):
    u = new_job(installed, priority=1)
    head = new_job(installed, group="g", priority=0)
    assert ids(claim_batch(installed, 1)) == [head]
    assert ids(claim_batch(installed, 1)) == [u]


# --- queue and priority range ---


@pytest.mark.parametrize(
    ("min_priority", "max_priority", "expected"),
    [(None, None, [1, 2, 3]), (2, None, [2, 3]), (None, 2, [1, 2]), (2, 2, [2]), (3, 1, [])],
)
def test_priority_bounds_are_inclusive_for_ungrouped_jobs_and_heads(
    installed, min_priority, max_priority, expected
):
    jobs = {}
    for priority in (1, 2, 3):
        jobs[priority] = [
            new_job(installed, priority=priority),
            new_job(installed, group=f"g{priority}", priority=priority),
        ]

    result = claim_batch(installed, 10, min_priority=min_priority, max_priority=max_priority)

    assert ids(result) == [j for p in expected for j in jobs[p]]


def test_sub_queues_are_included_and_lookalike_queues_are_not(installed):
    base = new_job(installed, queue="general")
    sub = new_job(installed, queue="general_x")
    sub_head = new_job(installed, queue="general_x", group="g")
    others = [new_job(installed, queue=q) for q in ("generalx", "other", "gen", "General")]
    other_head = new_job(installed, queue="generalx", group="h")

    assert ids(claim_batch(installed, 10, queue="general")) == [base, sub, sub_head]
    assert states(installed, *others, other_head) == [1, 1, 1, 1, 1]


# --- UNIQUE and coalescing (claim_job's checks) ---


@pytest.mark.parametrize("older_state", [2, 3, 5, 7])
def test_unique_job_with_an_older_row_of_its_identifier_is_redundant_and_not_returned(installed, older_state):
    older = new_job(installed, identifier="u")
    set_row(installed, older, state=older_state, number_of_attempts=1)
    dup = new_job(installed, identifier="u", mode="unique")
    plain = new_job(installed)

    result = claim_batch(installed, 10, now=at(7))

    assert ids(result) == [plain]
    after = row(installed, dup)
    assert (after["state"], after["finished_at"], after["number_of_attempts"]) == (7, at(7), 0)
    assert state(installed, older) == older_state


def test_two_unique_jobs_of_one_identifier_in_one_batch_run_once(installed):
    first = new_job(installed, identifier="u", mode="unique")
    second = new_job(installed, identifier="u", mode="unique")
    other = new_job(installed, identifier="v", mode="unique")

    assert ids(claim_batch(installed, 10)) == [first, other]
    assert states(installed, first, second, other) == [2, 7, 2]


def test_redundant_group_head_is_not_returned_and_its_successor_is_claimable(installed):
    older = new_job(installed, identifier="u")  # the older row of the identifier
    set_row(installed, older, state=3)
    head = new_job(installed, group="g", identifier="u", mode="unique")
    nxt = new_job(installed, group="g")

    first = claim_batch(installed, 10, now=at(7))

    assert head not in ids(first)
    after = row(installed, head)
    assert (after["state"], after["finished_at"], after["number_of_attempts"]) == (7, at(7), 0)
    assert ids(first) + ids(claim_batch(installed, 10, now=at(8))) == [nxt]


def test_a_claimed_group_head_coalesces_its_groups_unstarted_jobs(installed):
    head = new_job(installed, group="g", threshold=150)
    same = new_job(installed, group="g", threshold=150)
    higher_waiting = new_job(installed, group="g", threshold=300)
    higher_failed = new_job(installed, group="g", threshold=200)
    higher_broker_failed = new_job(installed, group="g", threshold=400)
    lower = new_job(installed, group="g", threshold=100)
    no_threshold = new_job(installed, group="g", threshold=None)
    finished = new_job(installed, group="g", threshold=900)
    set_row(installed, higher_waiting, state=6)
    set_row(installed, higher_failed, state=4)
    set_row(installed, higher_broker_failed, state=8)
    set_row(installed, finished, state=3, finished_at=T0)
    h_running = new_job(installed, group="h", threshold=1)
    claimed(installed, h_running)
    h_waiting = new_job(installed, group="h", threshold=900)
    untouched = {j: row(installed, j) for j in (lower, no_threshold, finished, h_running, h_waiting)}

    result = claim_batch(installed, 10, now=at(5))

    assert ids(result) == [head]
    for swallowed in (same, higher_waiting, higher_failed, higher_broker_failed):
        after = row(installed, swallowed)
        assert (swallowed, after["state"], after["finished_at"]) == (swallowed, 7, at(5))
    for job, before in untouched.items():
        assert row(installed, job) == before, job
    assert state(installed, head) == 2


# --- locks and races ---


def test_a_row_locked_by_another_transaction_is_skipped_not_waited_for(installed):
    a = new_job(installed)
    b = new_job(installed)
    c = new_job(installed)
    with background() as run, held_transaction(installed) as other:
        other.exec_driver_sql(f"SELECT id FROM {installed.table} WHERE id = %s FOR UPDATE", (a,)).all()
        future = run(claim_batch, installed, 10)
        blocked = blocked_or_done(installed, future)
        other.rollback()  # lets a blocked claim go on, so that the test ends either way
        result = future.result(timeout=60)
    assert ids(result) == [b, c]
    assert state(installed, a) == 1
    assert not blocked, "claim_batch waited for a row locked elsewhere (SKIP LOCKED)"
    assert ids(claim_batch(installed, 10)) == [a]


def test_an_open_batch_claim_and_a_second_one_get_disjoint_jobs(installed):
    jobs = [new_job(installed) for _ in range(5)]
    with background() as run, held_transaction(installed) as conn_a:
        first = claim_batch(installed, 3, conn=conn_a)
        second_future = run(claim_batch, installed, 10, pid=7)
        blocked = blocked_or_done(installed, second_future)
        conn_a.commit()
        second = second_future.result(timeout=60)
    assert ids(first) == jobs[:3]
    assert ids(second) == jobs[3:]
    assert not blocked, "the second claim_batch waited for the first one's rows"
    for job in jobs:
        after = row(installed, job)
        assert (after["state"], after["number_of_attempts"], after["pid"]) == (
            2,
            1,
            PID if job in jobs[:3] else 7,
        )


@pytest.mark.new_groups_only
def test_a_head_claimed_by_an_open_batch_is_not_claimed_again_by_a_second_batch(installed):
    g1 = new_job(installed, group="g")
    g2 = new_job(installed, group="g")
    h1 = new_job(installed, group="h")
    with background() as run, held_transaction(installed) as conn_a:
        assert ids(claim_batch(installed, 10, conn=conn_a)) == [g1, h1]
        second_future = run(claim_batch, installed, 10, pid=7)
        wait_for_lock_wait(installed)  # the second claim waits for group g's row (at most GROUP_LOCK_WAIT_S)
        conn_a.commit()
        second = second_future.result(timeout=60)
    assert second == []
    assert states(installed, g1, g2, h1) == [2, 1, 2]
    for job in (g1, h1):
        assert (row(installed, job)["number_of_attempts"], row(installed, job)["pid"]) == (1, PID)


def test_concurrent_batch_claims_never_return_the_same_job(installed):
    for _ in range(3):
        installed.clear()
        heads, followers = [], []
        for n in range(4):
            heads.append(new_job(installed, group=f"g{n}"))
            followers.append(new_job(installed, group=f"g{n}"))
        loners = [new_job(installed) for _ in range(12)]

        got_a, got_b = run_together(
            lambda: claim_batch(installed, 8, pid=1), lambda: claim_batch(installed, 8, pid=2)
        )

        a, b = set(ids(got_a)), set(ids(got_b))
        assert not a & b, f"both claimed {a & b}"
        assert a | b <= set(heads) | set(loners)
        assert len(a) == len(got_a) and len(b) == len(got_b)
        for job, pid in [(j, 1) for j in a] + [(j, 2) for j in b]:
            after = row(installed, job)
            assert (job, after["state"], after["number_of_attempts"], after["pid"]) == (job, 2, 1, pid)
        processing = installed.sql("SELECT id FROM {t} WHERE state = 2")
        assert {r["id"] for r in processing} == a | b
        assert states(installed, *followers) == [1, 1, 1, 1]


@pytest.mark.new_groups_only
def test_a_head_whose_group_row_another_transaction_holds_is_skipped_at_once(installed):
    """The group's head is left out without waiting; the rest of the batch is claimed all the same."""
    head = new_job(installed, group="g")
    loner = new_job(installed)

    def claim_b():
        with installed.db.transaction() as conn:
            setting_before = lock_timeout_setting(installed, conn)
            started = time.monotonic()
            result = claim_batch(installed, 10, pid=7, conn=conn, now=at(1))
            elapsed = time.monotonic() - started
            return result, elapsed, setting_before, lock_timeout_setting(installed, conn)

    installed.sql("INSERT INTO {t}_group (serial_group, updated_at) VALUES ('g', %s)", (T0,))
    with background() as run, held_transaction(installed) as conn_a:  # a finish of g, say
        conn_a.exec_driver_sql(
            f"SELECT serial_group FROM {installed.table}_group WHERE serial_group = 'g' FOR UPDATE"
        ).all()
        result, elapsed, setting_before, setting_after = run(claim_b).result(timeout=60)
        conn_a.rollback()

    assert ids(result) == [loner]
    assert elapsed < GROUP_LOCK_WAIT_S / 2  # a wait for the group row would take the lock wait
    assert states(installed, head, loner) == [1, 2]
    assert row(installed, loner)["pid"] == 7
    assert setting_after == setting_before


def test_max_heads_caps_the_group_heads_of_one_claim_but_not_the_ungrouped_jobs(installed):
    heads = [new_job(installed, group=f"g{i}") for i in range(3)]
    loose = [new_job(installed) for _ in range(2)]
    assert ids(claim_batch(installed, 10, max_heads=1)) == [heads[0], *loose]
    assert ids(claim_batch(installed, 10, max_heads=1)) == [heads[1]]
    assert ids(claim_batch(installed, 10)) == [heads[2]]


@pytest.mark.new_groups_only
def test_a_claim_that_loses_a_group_to_another_claim_takes_the_next_head(installed):
    """A batch of 1 whose best head belongs to a group another claim holds gets the next head."""
    first = new_job(installed, group="g0")
    second = new_job(installed, group="g1")
    for group in ("g0", "g1"):  # both claimed before, as any busy group was
        installed.sql("INSERT INTO {t}_group (serial_group, updated_at) VALUES (%s, %s)", (group, T0))
    with held_transaction(installed) as conn_a:
        assert ids(claim_batch(installed, 1, conn=conn_a, now=at(1))) == [first]
        started = time.monotonic()
        assert ids(claim_batch(installed, 1, now=at(1))) == [second]
        assert time.monotonic() - started < 1.5
        conn_a.rollback()


# --- errors ---


@pytest.mark.new_groups_only
@pytest.mark.parametrize("bad_limit", [None, 0, -1])
def test_a_limit_below_one_raises_and_writes_nothing(installed, bad_limit):
    loner = new_job(installed)
    head = new_job(installed, group="g")
    before = {j: row(installed, j) for j in (loner, head)}

    with pytest.raises(bgq.DatabaseError) as caught:
        claim_batch(installed, bad_limit)
    assert type(caught.value) is bgq.DatabaseError
    assert "claim_batch limit must be at least 1" in str(caught.value)

    with held_transaction(installed) as conn:  # even a caller that commits after the error
        with pytest.raises(bgq.DatabaseError):  # translated at the call seam (Database.call)
            procs(installed).claim_batch(conn, QUEUE, bad_limit, PID, None, None, 1500, T0)
        conn.commit()
    assert {j: row(installed, j) for j in (loner, head)} == before
    assert group_row(installed, "g") is None
