"""Contract of {table}_promote_waiting: the safety net promotes each idle group's WAITING head, only."""

from __future__ import annotations

from tests.support.helpers import (
    T0,
    at,
    background,
    claim,
    claimed,
    held_transaction,
    new_job,
    procs,
    row,
    set_row,
    states,
)


def promote(installed, now=T0):
    with installed.db.transaction() as conn:
        return [(j.id, j.queue, j.priority) for j in procs(installed).promote_waiting(conn, now)]


def heads(installed):
    with installed.db.transaction() as conn:
        return [h.id for h in procs(installed).group_heads(conn)]


def waiting_behind_a_blocker(installed, group, priorities, queue="general"):
    blocker = new_job(installed, group=group, priority=0)
    claimed(installed, blocker)
    ids = []
    for priority in priorities:
        job = new_job(installed, group=group, priority=priority, queue=queue)
        assert claim(installed, job).outcome == "waiting"
        ids.append(job)
    return blocker, ids


def test_promotes_exactly_the_heads_of_idle_groups(installed):
    """gA = a1(p2), a2(p1), a3(p1); gB = b1(p3), b2(p2); their blockers ended without a finish."""
    block_a, (a1, a2, a3) = waiting_behind_a_blocker(installed, "gA", [2, 1, 1])
    block_b, (b1, b2) = waiting_behind_a_blocker(installed, "gB", [3, 2], queue="general_x")
    set_row(installed, block_a, state=3)
    set_row(installed, block_b, state=5)

    promoted = promote(installed, now=at(7))

    assert promoted == [(a2, "general", 1), (b2, "general_x", 2)]
    assert states(installed, a1, a2, a3, b1, b2) == [6, 1, 6, 6, 1]
    for job in (a2, b2):
        after = row(installed, job)
        assert (after["error_message"], after["postponed_by"], after["updated_at"]) == (None, None, at(7))
    assert heads(installed) == [a3, b1]


def test_second_call_promotes_nothing_more(installed):
    block, (a1, a2) = waiting_behind_a_blocker(installed, "g", [1, 1])
    set_row(installed, block, state=3)
    assert [p[0] for p in promote(installed)] == [a1]
    assert promote(installed) == []
    assert states(installed, a1, a2) == [1, 6]


def test_group_with_a_processing_job_is_left_alone(installed):
    _, (a1,) = waiting_behind_a_blocker(installed, "g", [1])
    assert promote(installed) == []
    assert states(installed, a1) == [6]


def test_group_whose_head_is_claimable_but_not_waiting_is_left_alone(installed):
    """A reaped blocker is TEMPORARILY_FAILED and first in line: it runs first, nobody is promoted."""
    block, (a1,) = waiting_behind_a_blocker(installed, "g", [1])
    with installed.db.transaction() as conn:
        assert [r.id for r in procs(installed).reap(conn, "general", 60, 10, at(61))] == [block]
    assert promote(installed, now=at(62)) == []
    assert states(installed, block, a1) == [4, 6]


def test_only_waiting_rows_are_promoted(installed):
    """The recorded head left WAITING by hand (a DBA failed it): promotion must not touch it."""
    block, (a1,) = waiting_behind_a_blocker(installed, "g", [1])
    set_row(installed, block, state=3)
    set_row(installed, a1, state=5, error_message="given up")
    before = row(installed, a1)
    assert promote(installed) == []
    assert row(installed, a1) == before


def test_group_being_claimed_or_finished_is_skipped_not_waited_for(installed):
    block_a, (a1,) = waiting_behind_a_blocker(installed, "gA", [1])
    block_b, (b1,) = waiting_behind_a_blocker(installed, "gB", [1])
    set_row(installed, block_a, state=3)
    set_row(installed, block_b, state=3)
    with background() as run, held_transaction(installed) as conn_a:
        conn_a.exec_driver_sql(
            f"SELECT serial_group FROM {installed.table}_group WHERE serial_group = %s FOR UPDATE", ("gA",)
        ).all()
        call = run(promote, installed)
        promoted = call.result(timeout=30)  # a blocked call would hang here, not return
        conn_a.rollback()
    assert [p[0] for p in promoted] == [b1]
    assert states(installed, a1, b1) == [6, 1]
    assert [p[0] for p in promote(installed)] == [a1]
