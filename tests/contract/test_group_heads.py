"""Contract of {table}_group_heads: one WAITING head per group, by (priority, id), a priority gap included."""

from __future__ import annotations

from tests.support.helpers import claim, claimed, finish, new_job, procs, set_row


def group_heads(installed):
    with installed.db.transaction() as conn:
        return [(h.serial_group, h.id, h.priority) for h in procs(installed).group_heads(conn)]


def waiting_behind_a_blocker(installed, group, priorities):
    """A PROCESSING blocker of `group`, then one WAITING job per priority; returns (blocker, token, ids)."""
    blocker = new_job(installed, group=group, priority=0)
    token = claimed(installed, blocker)
    ids = []
    for priority in priorities:
        job = new_job(installed, group=group, priority=priority)
        assert claim(installed, job).outcome == "waiting"
        ids.append(job)
    return blocker, token, ids


def test_no_waiting_jobs_no_heads(installed):
    claimed(installed, new_job(installed, group="g"))
    new_job(installed, group="g")
    new_job(installed)
    assert group_heads(installed) == []


def test_heads_with_a_priority_gap(installed):
    """gA = a1(p2), a2(p1), a3(p1); gB = b1(p3), b2(p2): the heads are exactly a2 and b2."""
    _, _, (a1, a2, a3) = waiting_behind_a_blocker(installed, "gA", [2, 1, 1])
    _, _, (b1, b2) = waiting_behind_a_blocker(installed, "gB", [3, 2])
    assert group_heads(installed) == [("gA", a2, 1), ("gB", b2, 2)]


def test_heads_are_ordered_by_id(installed):
    _, _, (late,) = waiting_behind_a_blocker(installed, "late", [1])
    _, _, (early_group_head,) = waiting_behind_a_blocker(installed, "early", [1])
    assert [h[1] for h in group_heads(installed)] == sorted([late, early_group_head])


def test_head_moves_on_after_a_promotion(installed):
    blocker, token, (a1, a2, a3) = waiting_behind_a_blocker(installed, "gA", [2, 1, 1])
    assert finish(installed, blocker, token, 3).promoted_id == a2
    assert group_heads(installed) == [("gA", a3, 1)]


def test_head_leaves_when_it_stops_waiting(installed):
    blocker, token, (a1,) = waiting_behind_a_blocker(installed, "gA", [1])
    assert finish(installed, blocker, token, 4).promoted_id is None  # a1 still waits
    assert group_heads(installed) == [("gA", a1, 1)]
    assert claim(installed, a1).outcome == "waiting"  # behind the failed blocker, first in line
    set_row(installed, blocker, state=5)
    assert claim(installed, a1).outcome == "claimed"
    assert group_heads(installed) == []
