"""Contract of {table}_finish: the result write, fencing on the attempt token, promotion of the successor."""

from __future__ import annotations

import pytest

import bgq
from tests.support.helpers import (
    T0,
    at,
    claim,
    claimed,
    finish,
    finish_batch,
    group_row,
    new_job,
    procs,
    row,
    set_row,
    state,
    states,
)


def _waiting_pair(installed, **second):
    """A PROCESSING job of group g and a second job of g that waits for it."""
    first = new_job(installed, group="g")
    waiter = new_job(installed, group="g", **second)
    attempt = claimed(installed, first, now=T0)
    assert claim(installed, waiter, now=T0).outcome == "waiting"
    return first, attempt, waiter


# --- the result write ---


def test_finished_result_is_written(installed):
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)

    result = finish(
        installed, job, attempt, 3, execution_time=12, memory='{"before": 1, "after": 2}', now=at(4)
    )

    assert result.finished is True
    assert (result.promoted_id, result.promoted_queue, result.promoted_priority) == (None, None, None)
    after = row(installed, job)
    assert after["state"] == 3
    assert after["finished_at"] == at(4)
    assert after["updated_at"] == at(4)
    assert after["execution_time"] == 12
    assert after["memory"] == {"before": 1, "after": 2}
    assert after["error_message"] is None
    assert after["postponed_by"] is None
    assert after["number_of_attempts"] == attempt == 1
    assert after["last_attempt_at"] == T0


def test_temporary_failure_keeps_the_job_claimable_after_its_backoff(installed):
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)

    assert finish(installed, job, attempt, 4, error="SMTP down", postponed_by=60000, now=at(2)).finished

    after = row(installed, job)
    assert (after["state"], after["error_message"], after["postponed_by"]) == (4, "SMTP down", 60000)
    assert after["finished_at"] is None
    assert after["updated_at"] == at(2)
    with installed.db.transaction() as conn:
        due_early = procs(installed).due_jobs(conn, "general", False, 10, at(59))
        due_later = procs(installed).due_jobs(conn, "general", False, 10, at(60))
    assert [j.id for j in due_early] == []  # last_attempt_at (T0) + 60 s
    assert [j.id for j in due_later] == [job]


@pytest.mark.parametrize(("job_state", "sets_finished_at"), [(5, False), (7, True)])
def test_permanent_failure_and_redundant_results(installed, job_state, sets_finished_at):
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)
    assert finish(installed, job, attempt, job_state, error="why", now=at(3)).finished
    after = row(installed, job)
    assert (after["state"], after["error_message"]) == (job_state, "why")
    assert after["finished_at"] == (at(3) if sets_finished_at else None)


def test_a_give_back_is_stored_as_finish_batch_stores_it_and_returns_the_job_its_group_promoted(installed):
    """State 1 READY gives back a claimed, unstarted job (bgq consume's stale hold). While it
    was held a better-priority job of its group turned WAITING behind it: the give-back wakes the
    group and returns that job, so the consumer can send it (nobody else would, but the
    lost-message pass an hour later). The row is what finish_batch's give-back stores."""
    from bgq.model import JobResult

    rows = {}
    for group, via_finish in (("g", True), ("h", False)):
        head = new_job(installed, group=group, priority=2)
        before = row(installed, head)
        attempt = claimed(installed, head, now=T0)
        better = new_job(installed, group=group, priority=1)
        assert claim(installed, better, now=at(1)).outcome == "waiting"
        if via_finish:
            result = finish(installed, head, attempt, 1, now=at(2))
            assert result.finished and result.promoted_id == better
            assert (result.promoted_queue, result.promoted_priority) == (before["queue"], 1)
        else:
            assert finish_batch(installed, [JobResult(head, attempt, 1)], now=at(2)) == {head: True}
        assert state(installed, better) == 1  # READY: promoted
        after = row(installed, head)
        assert (after["state"], after["number_of_attempts"], after["pid"]) == (
            1,
            before["number_of_attempts"],
            None,
        )
        rows[group] = {k: v for k, v in after.items() if k not in ("id", "serial_group", "created_at")}
    assert rows["g"] == rows["h"]


@pytest.mark.parametrize("bad_state", [-1, 0, 2, 6, 8])
def test_finish_with_a_state_that_is_not_a_result_raises_and_writes_nothing(installed, bad_state):
    job = new_job(installed, group="g")
    attempt = claimed(installed, job, now=T0)
    before = row(installed, job)
    with pytest.raises(bgq.DatabaseError) as caught:
        finish(installed, job, attempt, bad_state, now=at(1))
    assert type(caught.value) is bgq.DatabaseError
    assert "finish state must be 1, 3, 4, 5 or 7" in str(caught.value)
    assert row(installed, job) == before


# --- fencing ---


@pytest.mark.parametrize("token_offset", [-1, 1])
def test_finish_with_a_stale_token_changes_nothing(installed, token_offset):
    first, attempt, waiter = _waiting_pair(installed)
    before = row(installed, first)
    before_waiter = row(installed, waiter)

    result = finish(installed, first, attempt + token_offset, 3, error="late", now=at(9))

    assert result.finished is False
    assert result.promoted_id is None
    assert row(installed, first) == before
    assert row(installed, waiter) == before_waiter


def test_repeated_finish_is_fenced_out(installed):
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)
    assert finish(installed, job, attempt, 3, now=at(1)).finished
    before = row(installed, job)
    again = finish(installed, job, attempt, 5, error="again", now=at(2))
    assert again.finished is False
    assert row(installed, job) == before


@pytest.mark.parametrize("job_state", [1, 4, 6])
def test_finish_of_a_job_that_is_not_processing_changes_nothing(installed, job_state):
    job = new_job(installed)
    set_row(installed, job, state=job_state, number_of_attempts=1)
    before = row(installed, job)
    assert finish(installed, job, 1, 3, now=at(1)).finished is False
    assert row(installed, job) == before


def test_finish_of_an_unknown_job_returns_one_row_not_finished(installed):
    result = finish(installed, 987654, 1, 3)
    assert (result.finished, result.promoted_id, result.promoted_queue) == (False, None, None)


def test_reaped_then_reclaimed_job_cannot_be_finished_by_the_old_token(installed):
    job = new_job(installed, group="g")
    old_token = claimed(installed, job, now=T0)
    with installed.db.transaction() as conn:
        reaped = procs(installed).reap(conn, "general", 60, 10, at(61))
    assert [r.id for r in reaped] == [job]
    new_token = claimed(installed, job, pid=5151, now=at(62))
    assert new_token == old_token + 1
    before = row(installed, job)

    zombie = finish(installed, job, old_token, 3, error=None, now=at(63))

    assert zombie.finished is False
    assert row(installed, job) == before
    assert (before["state"], before["pid"]) == (2, 5151)
    owner = finish(installed, job, new_token, 3, now=at(64))
    assert owner.finished is True
    assert state(installed, job) == 3


# --- promotion of the successor ---


@pytest.mark.parametrize("job_state", [3, 5, 7])
def test_finish_promotes_the_waiting_head_after_a_final_result(installed, job_state):
    first, attempt, waiter = _waiting_pair(installed, queue="general_x", priority=3)

    result = finish(installed, first, attempt, job_state, now=at(5))

    assert result.finished is True
    assert (result.promoted_id, result.promoted_queue, result.promoted_priority) == (waiter, "general_x", 3)
    after = row(installed, waiter)
    assert after["state"] == 1
    assert after["error_message"] is None
    assert after["postponed_by"] is None
    assert after["updated_at"] == at(5)
    assert group_row(installed, "g")["waiting_head_id"] is None


def test_temporary_failure_promotes_nobody(installed):
    first, attempt, waiter = _waiting_pair(installed)

    result = finish(installed, first, attempt, 4, error="again later", postponed_by=60000, now=at(5))

    assert result.finished is True
    assert (result.promoted_id, result.promoted_queue, result.promoted_priority) == (None, None, None)
    assert states(installed, first, waiter) == [4, 6]
    assert group_row(installed, "g")["waiting_head_id"] == waiter


def test_finish_promotes_the_head_by_priority_then_id(installed):
    first = new_job(installed, group="g", priority=1)
    worse = new_job(installed, group="g", priority=2)
    better = new_job(installed, group="g", priority=1)
    better_later = new_job(installed, group="g", priority=1)
    attempt = claimed(installed, first)
    for job in (worse, better, better_later):
        assert claim(installed, job).outcome == "waiting"

    result = finish(installed, first, attempt, 3)

    assert result.promoted_id == better
    assert states(installed, worse, better, better_later) == [6, 1, 6]
    assert group_row(installed, "g")["waiting_head_id"] == better_later


def test_finish_promotes_only_waiting_rows(installed):
    """The head of the group is READY (it never waited): nothing is promoted, the WAITING job stays."""
    first = new_job(installed, group="g", priority=2)
    attempt = claimed(installed, first)
    waiter = new_job(installed, group="g", priority=2)
    assert claim(installed, waiter).outcome == "waiting"
    ready = new_job(installed, group="g", priority=1)  # published while first ran, never claimed

    result = finish(installed, first, attempt, 3)

    assert result.promoted_id is None
    assert states(installed, waiter, ready) == [6, 1]


def test_temporary_failure_of_a_worse_priority_job_lets_the_better_head_go(installed):
    """A running worse-priority job fails for now; the better-priority job it blocked is first in line."""
    running = new_job(installed, group="g", priority=5)
    attempt = claimed(installed, running)
    better = new_job(installed, group="g", priority=1)
    assert claim(installed, better).outcome == "waiting"

    result = finish(installed, running, attempt, 4, postponed_by=60000)

    assert result.promoted_id == better
    assert states(installed, running, better) == [4, 1]


def test_finish_of_an_ungrouped_job_promotes_nobody(installed):
    first, _, waiter = _waiting_pair(installed)
    loner = new_job(installed)
    attempt = claimed(installed, loner)
    assert finish(installed, loner, attempt, 3).promoted_id is None
    assert state(installed, waiter) == 6


def test_canonical_order_of_a_serial_group(installed):
    """a1 b1 c2 d1 e1 f2 g1 in one group start as a b d e g c f (cron mode: due jobs in id order)."""
    names = ["a1", "b1", "c2", "d1", "e1", "f2", "g1"]
    ids = {new_job(installed, group="transcribe", priority=int(n[1])): n[0] for n in names}
    order: list[str] = []
    promoted: list[str] = []
    for step in range(1, 6):
        now = at(step * 10)
        with installed.db.transaction() as conn:
            due = procs(installed).due_jobs(conn, "general", False, 1000, now)
        if not due:
            break
        for job in due:
            result = claim(installed, job.id, now=now)
            if result.outcome != "claimed":
                continue
            order.append(ids[job.id])
            done = finish(installed, job.id, result.attempt, 3, now=now)
            assert done.finished
            if done.promoted_id is not None:
                promoted.append(ids[done.promoted_id])
    assert "".join(order) == "abdegcf"
    assert promoted == ["c", "f"]


# --- copies (RECURRING, WaitingException): written by the same writer as every result ---


def test_a_copy_is_inserted_and_returned_for_publishing(installed):
    job = new_job(installed, group="g", identifier="report-7", queue="general_x", priority=3)
    attempt = claimed(installed, job, now=T0)

    result = finish(installed, job, attempt, 3, error="not yet", clone_delay_ms=1500, now=at(2))

    assert result.finished is True
    assert result.clone_id is not None and result.clone_id > job
    copy = row(installed, result.clone_id)
    assert (copy["state"], copy["number_of_attempts"], copy["postponed_by"]) == (1, 0, 1500)
    assert (copy["queue"], copy["priority"], copy["serial_group"], copy["identifier"]) == (
        "general_x",
        3,
        "g",
        "report-7",
    )
    assert (copy["created_at"], copy["updated_at"]) == (at(2), at(2))
    assert (state(installed, job), row(installed, job)["error_message"]) == (3, "not yet")


def test_a_finished_recurring_job_is_replaced_and_its_group_woken(installed):
    first, attempt, waiter = _waiting_pair(installed, queue="general_x")  # before the successor
    set_row(installed, first, mode="recurring", identifier="nightly")

    result = finish(installed, first, attempt, 3, clone_delay_ms=60000, now=at(5))

    assert result.finished is True
    assert (result.promoted_id, result.promoted_queue, result.promoted_priority) == (waiter, "general_x", 1)
    assert row(installed, first) is None
    successor = row(installed, result.clone_id)
    assert (successor["identifier"], successor["mode"], successor["state"]) == ("nightly", "recurring", 1)
    assert state(installed, waiter) == 1


def test_a_finished_recurring_job_without_a_copy_raises_and_writes_nothing(installed):
    """No recurring job silently stops recurring (one rule with finish_batch and hand_off)."""
    job = new_job(installed, identifier="nightly", mode="recurring")
    attempt = claimed(installed, job, now=T0)
    before = row(installed, job)
    with pytest.raises(bgq.DatabaseError) as caught:
        finish(installed, job, attempt, 3, now=at(1))
    assert "a finished recurring job needs clone_delay_ms" in str(caught.value)
    assert row(installed, job) == before
    assert finish(installed, job, attempt, 5, error="stop it", now=at(2)).finished  # a stop is explicit


def test_a_fenced_out_finish_makes_no_copy(installed):
    job = new_job(installed, identifier="nightly", mode="recurring")
    attempt = claimed(installed, job, now=T0)
    result = finish(installed, job, attempt + 1, 3, clone_delay_ms=1000, now=at(1))
    assert (result.finished, result.clone_id) == (False, None)
    assert installed.sql("SELECT COUNT(*) AS n FROM {t}")[0]["n"] == 1
