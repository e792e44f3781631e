"""Contract of {table}_predecessor: the job a grouped job waits for, by PROCESSING, then (priority, id)."""

from __future__ import annotations

import pytest

from tests.support.helpers import claimed, new_job, procs, set_row


def predecessor(installed, job_id):
    with installed.db.transaction() as conn:
        return procs(installed).predecessor(conn, job_id)


def test_job_without_a_group_has_no_predecessor(installed):
    first = new_job(installed)
    claimed(installed, first)
    assert predecessor(installed, new_job(installed)) is None


def test_unknown_job_has_no_predecessor(installed):
    assert predecessor(installed, 987654) is None


def test_first_in_line_has_no_predecessor(installed):
    head = new_job(installed, group="g")
    new_job(installed, group="g")
    assert predecessor(installed, head) is None


def test_same_priority_jobs_wait_for_the_group_head_in_id_order(installed):
    a = new_job(installed, group="g")
    b = new_job(installed, group="g")
    c = new_job(installed, group="g")
    assert [predecessor(installed, j) for j in (a, b, c)] == [None, a, a]
    set_row(installed, a, state=3)
    assert [predecessor(installed, j) for j in (b, c)] == [None, b]


def test_lower_priority_number_goes_first_whatever_its_id(installed):
    late_worse = new_job(installed, group="g", priority=3)
    better = new_job(installed, group="g", priority=1)  # a gap: no priority 2
    worse_still = new_job(installed, group="g", priority=7)
    assert predecessor(installed, late_worse) == better
    assert predecessor(installed, worse_still) == better
    assert predecessor(installed, better) is None


def test_running_worse_priority_job_blocks_a_better_priority_newcomer(installed):
    running = new_job(installed, group="g", priority=9)
    claimed(installed, running)
    newcomer = new_job(installed, group="g", priority=1)
    assert predecessor(installed, newcomer) == running


def test_processing_job_comes_before_a_claimable_head(installed):
    head = new_job(installed, group="g", priority=1)
    running = new_job(installed, group="g", priority=5)
    set_row(installed, head, state=5)
    claimed(installed, running)
    set_row(installed, head, state=1)  # back in line while running runs
    last = new_job(installed, group="g", priority=1)
    assert predecessor(installed, last) == running


@pytest.mark.parametrize("blocker_state", [-1, 1, 4, 6, 8])
def test_every_claimable_state_is_in_line(installed, blocker_state):
    blocker = new_job(installed, group="g")
    job = new_job(installed, group="g")
    set_row(installed, blocker, state=blocker_state)
    assert predecessor(installed, job) == blocker


@pytest.mark.parametrize("done_state", [3, 5, 7])
def test_finished_failed_and_redundant_jobs_are_not_in_line(installed, done_state):
    done = new_job(installed, group="g", priority=0)
    job = new_job(installed, group="g")
    set_row(installed, done, state=done_state)
    assert predecessor(installed, job) is None


def test_other_groups_do_not_count_and_names_compare_byte_wise(installed):
    for other in ("h", "G", "g2"):
        claimed(installed, new_job(installed, group=other))
        new_job(installed, group=other, priority=0)
    job = new_job(installed, group="g")
    assert predecessor(installed, job) is None


def test_a_group_spans_queues(installed):
    elsewhere = new_job(installed, group="g", queue="other")
    job = new_job(installed, group="g")
    assert predecessor(installed, job) == elsewhere
    claimed(installed, elsewhere, queue="other")
    assert predecessor(installed, job) == elsewhere
