"""process() and process_job() end to end on both dialects: the seed's tests and the Core checklist lines."""

from __future__ import annotations

import datetime as dt
import logging
import time

import pytest

from bgq import (
    DieException,
    JobState,
    PermanentErrorException,
    SkipException,
    TemporaryErrorException,
    WaitingException,
)
from tests.support.clock import Clock
from tests.support.helpers import json_column, set_row, state_of

MINUTE = 60_000


def _row(installed, job_id):
    return installed.sql("SELECT * FROM {t} WHERE id = %s", (job_id,))[0]


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))


def test_seed_1_jobs_without_group_never_wait(make_queue, installed):
    """Seed Test 1 / checklist 46: no group -> never WAITING, never a group row; process() runs all."""
    rec = Recorder()
    queue = make_queue(callbacks={"rec": rec}, priorities=[1, 2])
    ids = [queue.publish("rec", [n], priority=p) for n, p in ((1, 2), (2, 1), (3, 2))]
    report = queue.process()
    assert report.outcomes == {"claimed": 3}
    assert [state_of(installed, i) for i in ids] == [JobState.FINISHED] * 3
    assert installed.sql("SELECT COUNT(*) AS n FROM {t}_group")[0]["n"] == 0
    # Cron mode claims as `bgq work` does, in (priority, id) order (the original's id order let
    # a window of 1000 blocked rows hide every runnable one).
    assert [c[0] for c in rec.calls] == [(2,), (1,), (3,)]


def test_seed_2a_predecessor_by_priority(make_queue, installed):
    """Seed Test 2a / checklist 47: A (id1, p2) and B (id2, p1): pred(B) = None, pred(A) = B."""
    queue = make_queue(priorities=[1, 2])
    a = queue.publish("noop", serial_group="g", priority=2)
    b = queue.publish("noop", serial_group="g", priority=1)
    with installed.db.transaction() as conn:
        assert queue.procs.predecessor(conn, b) is None
        assert queue.procs.predecessor(conn, a) == b
    assert queue.process_job(a) == "waiting"
    assert queue.process_job(b) == "claimed"


def test_seed_3_processing_clause_blocks_better_priority(make_queue, installed):
    """Seed Test 3 / checklist 50: A (p2) PROCESSING blocks B (p1); once A is FINISHED it does not."""
    queue = make_queue(priorities=[1, 2])
    a = queue.publish("noop", serial_group="g", priority=2)
    b = queue.publish("noop", serial_group="g", priority=1)
    set_row(installed, a, state=2)
    assert queue.process_job(b) == "waiting"
    row = _row(installed, b)
    assert row["state"] == JobState.WAITING
    assert row["error_message"] == f"Waiting for job ID {a}"  # checklist 48
    assert row["postponed_by"] == 1000
    set_row(installed, a, state=3)
    set_row(installed, b, state=1)
    assert queue.process_job(b) == "claimed"
    assert state_of(installed, b) == JobState.FINISHED


def test_seed_5_conditional_claim_runs_nothing_for_a_finished_row(make_queue, installed):
    """Seed Test 5 / checklists 24, 25: a row switched to FINISHED behind the queue's back is not run."""
    rec = Recorder()
    queue = make_queue(callbacks={"rec": rec})
    done = queue.publish("rec")
    set_row(installed, done, state=3)
    assert queue.process_job(done) == "skipped"
    assert rec.calls == [] and state_of(installed, done) == JobState.FINISHED
    fresh = queue.publish("rec")  # negative control
    assert queue.process_job(fresh) == "claimed"
    assert len(rec.calls) == 1 and state_of(installed, fresh) == JobState.FINISHED


@pytest.mark.parametrize("state", [JobState.PROCESSING, JobState.PERMANENTLY_FAILED])
def test_checklist_26_unexpected_state_logs(make_queue, installed, caplog, state):
    rec = Recorder()
    queue = make_queue(callbacks={"rec": rec})
    job = queue.publish("rec")
    set_row(installed, job, state=int(state))
    with caplog.at_level(logging.INFO, logger="bgq"):
        assert queue.process_job(job) == "unexpected"
    assert rec.calls == [] and state_of(installed, job) == state
    (record,) = [r for r in caplog.records if "Unexpected state" in r.getMessage()]
    assert f'Unexpected state "{int(state)}"' in record.getMessage()
    # A claim race another worker won is normal; neither case needs a person (issue: alerting
    # on CRITICAL must stay useful).
    assert record.levelno == (logging.INFO if state == JobState.PROCESSING else logging.WARNING)


def test_checklist_25_27_finished_redundant_and_missing_are_silent(make_queue, installed, caplog):
    queue = make_queue()
    finished, redundant = queue.publish("noop"), queue.publish("noop")
    set_row(installed, finished, state=3)
    set_row(installed, redundant, state=7)
    with caplog.at_level(logging.DEBUG, logger="bgq"):
        assert queue.process_job(finished) == "skipped"
        assert queue.process_job(redundant) == "skipped"
        assert queue.process_job(10**12) == "missing"
    assert caplog.records == []


def test_seed_7_group_heads_with_a_priority_gap(make_queue, installed):
    """Seed Test 7 / checklist 61: heads by (priority, id) with a gap; promotion touches only heads."""
    queue = make_queue(priorities=[1, 2, 3])
    a1 = queue.publish("noop", serial_group="gA", priority=2)
    a2 = queue.publish("noop", serial_group="gA", priority=1)
    a3 = queue.publish("noop", serial_group="gA", priority=1)
    b1 = queue.publish("noop", serial_group="gB", priority=3)
    b2 = queue.publish("noop", serial_group="gB", priority=2)
    # Force everything to WAITING through the claim itself: a running job blocks each group.
    blockers = [queue.publish("noop", serial_group=g, priority=1) for g in ("gA", "gB")]
    for blocker in blockers:
        set_row(installed, blocker, state=2)
    for job in (a1, a2, a3, b1, b2):
        assert queue.process_job(job) == "waiting"
    with installed.db.transaction() as conn:
        heads = {h.serial_group: h.id for h in queue.procs.group_heads(conn)}
    assert heads == {"gA": a2, "gB": b2}
    for blocker in blockers:
        set_row(installed, blocker, state=3)
    with installed.db.transaction() as conn:
        promoted = {j.id for j in queue.procs.promote_waiting(conn)}
    assert promoted == {a2, b2}
    assert [state_of(installed, j) for j in (a1, a2, a3, b1, b2)] == [6, 1, 6, 6, 1]


def test_checklist_22_success_bookkeeping(make_queue, installed):
    queue = make_queue(callbacks={"ok": lambda: None})
    job = queue.publish("ok")
    queue.process_job(job)
    row = _row(installed, job)
    assert row["state"] == JobState.FINISHED
    assert row["finished_at"] is not None and row["error_message"] is None
    assert row["execution_time"] is not None and row["execution_time"] >= 0
    memory = json_column(row["memory"])
    assert set(memory) == {"before", "after"} and memory["after"]["rss"] > 0


def test_checklist_23_claim_bookkeeping(make_queue, installed):
    seen = {}

    def check(**kwargs):
        seen.update(_row(installed, job))

    queue = make_queue(callbacks={"check": check}, on_processing_get_metadata=lambda p: {"host": "h1", **p})
    job = queue.publish("check", {"x": 1}, postpone_by=5)
    set_row(installed, job, error_message="old", state=4)
    queue.process_job(job)
    import os

    assert seen["state"] == JobState.PROCESSING and seen["number_of_attempts"] == 1
    assert seen["pid"] == os.getpid() and seen["last_attempt_at"] is not None
    assert seen["postponed_by"] is None and seen["error_message"] is None
    assert json_column(seen["metadata"]) == {"host": "h1", "x": 1}


@pytest.mark.parametrize(
    ("raised", "state"),
    [
        (PermanentErrorException("bad"), JobState.PERMANENTLY_FAILED),  # 28
        (TypeError("arity"), JobState.PERMANENTLY_FAILED),  # 29
        (ZeroDivisionError("x"), JobState.PERMANENTLY_FAILED),  # 29
        (AttributeError("None has no x"), JobState.PERMANENTLY_FAILED),  # 29
        (RuntimeError("smtp down"), JobState.TEMPORARILY_FAILED),  # 30
        (TemporaryErrorException("later"), JobState.TEMPORARILY_FAILED),  # 30
        (SkipException("nothing to do"), JobState.FINISHED),
        (WaitingException("not yet"), JobState.FINISHED),
        (DieException("stop"), JobState.PERMANENTLY_FAILED),
    ],
)
def test_checklist_28_30_outcomes(make_queue, installed, raised, state):
    def fail():
        raise raised

    queue = make_queue(callbacks={"fail": fail})
    job = queue.publish("fail")
    queue.process_job(job)
    row = _row(installed, job)
    assert row["state"] == state
    assert str(raised) in row["error_message"]
    if state == JobState.TEMPORARILY_FAILED:
        assert row["postponed_by"] == MINUTE  # first attempt: 1 minute (checklist 30/31)
    assert queue.should_die is isinstance(raised, DieException)


def test_checklist_28_permanent_error_is_logged_critical(make_queue, installed, caplog):
    def fail():
        raise PermanentErrorException("bad address")

    queue = make_queue(callbacks={"fail": fail})
    job = queue.publish("fail")
    with caplog.at_level(logging.CRITICAL, logger="bgq"):
        queue.process_job(job)
    (record,) = [r for r in caplog.records if "Permanent error occurred." in r.getMessage()]
    assert record.levelno == logging.CRITICAL and f"(ID: {job})" in record.getMessage()
    assert isinstance(record.exc_info[1], PermanentErrorException)


def test_checklist_29_programming_errors_from_arguments(make_queue, installed):
    """Missing argument and unknown keyword are programming errors: permanent, not retried."""
    queue = make_queue(callbacks={"needs": lambda to: None})
    missing = queue.publish("needs")
    unknown = queue.publish("needs", {"to": 1, "unknown_parameter": 1})
    queue.process_job(missing)
    queue.process_job(unknown)
    assert state_of(installed, missing) == state_of(installed, unknown) == JobState.PERMANENTLY_FAILED


def test_checklist_31_backoff_grows_with_attempts(make_queue, installed):
    def fail():
        raise RuntimeError("down")

    queue = make_queue(callbacks={"fail": fail})
    job = queue.publish("fail")
    seen = []
    for _ in range(6):
        set_row(installed, job, state=1)
        queue.process_job(job)
        seen.append(_row(installed, job)["postponed_by"] // MINUTE)
    assert seen == [1, 2, 4, 8, 16, 16]


def test_checklist_33_notify_once_at_the_configured_attempt(make_queue, installed, caplog):
    def fail():
        raise RuntimeError("down")

    queue = make_queue(callbacks={"fail": fail}, notify_on_number_of_attempts=2)
    job = queue.publish("fail")
    messages = []
    for _ in range(3):
        caplog.clear()
        set_row(installed, job, state=1)
        with caplog.at_level(logging.CRITICAL, logger="bgq"):
            queue.process_job(job)
        messages.append("Number of attempts reached" in caplog.text)
    assert messages == [False, True, False]


def test_a_temporary_failure_is_logged_at_warning_with_its_error_and_retry(make_queue, installed, caplog):
    """The worker's log (WARNING, shown by default) says why a job failed and when it is retried;
    a finished job stays at INFO."""

    def fail():
        raise RuntimeError("the gateway is down")

    queue = make_queue(callbacks={"fail": fail, "noop": lambda: None})
    bad, ok = queue.publish("fail"), queue.publish("noop")
    with caplog.at_level(logging.INFO, logger="bgq"):
        queue.process()
    ran = {r.job_id: r for r in caplog.records if getattr(r, "outcome", None)}
    assert ran[bad].levelno == logging.WARNING
    assert ran[bad].getMessage() == (
        f"bgq: Job ran: temporarily_failed, retried in 60 s: RuntimeError: the gateway is down (ID: {bad})"
    )
    assert ran[bad].error == "RuntimeError: the gateway is down"
    assert ran[ok].levelno == logging.INFO and not hasattr(ran[ok], "error")


def test_checklist_32_temporary_failure_rerun_by_process_after_backoff(make_queue, installed):
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first time")

    clock = Clock()
    queue = make_queue(callbacks={"flaky": flaky}, clock=clock)
    job = queue.publish("flaky")
    queue.process()
    assert state_of(installed, job) == JobState.TEMPORARILY_FAILED
    clock.advance(59.9)
    queue.process()  # still in its 1-minute backoff
    assert len(calls) == 1
    clock.advance(0.1)
    queue.process()
    assert len(calls) == 2 and state_of(installed, job) == JobState.FINISHED


def test_checklist_10_postponed_job_waits_in_cron_mode(make_queue, installed):
    rec, clock = Recorder(), Clock()
    queue = make_queue(callbacks={"rec": rec}, clock=clock)
    later = queue.publish("rec", postpone_by=dt.timedelta(minutes=5))
    now = queue.publish("rec")
    queue.process()
    assert state_of(installed, later) == JobState.READY and state_of(installed, now) == JobState.FINISHED
    clock.advance(299.9)
    queue.process()
    assert state_of(installed, later) == JobState.READY
    clock.advance(0.1)
    queue.process()
    assert state_of(installed, later) == JobState.FINISHED


def test_checklist_65_66_cron_states_order_and_back_to_broker_ignored(make_queue, installed):
    rec = Recorder()
    queue = make_queue(callbacks={"rec": rec})
    ids = [queue.publish("rec", [n]) for n in range(5)]
    past = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(hours=1)
    for job, state in zip(ids, (1, 4, 6, 8, -1), strict=True):
        set_row(installed, job, state=state, created_at=past)
    queue.process()
    assert [c[0][0] for c in rec.calls] == [0, 1, 2, 3]
    assert state_of(installed, ids[4]) == JobState.BACK_TO_BROKER


def test_checklist_65_at_most_1000_per_run(make_queue, installed, monkeypatch):
    import bgq.modes.process

    monkeypatch.setattr(bgq.modes.process, "PROCESS_LIMIT", 3)
    queue = make_queue()
    ids = [queue.publish("noop") for _ in range(5)]
    assert sum(queue.process().outcomes.values()) == 3
    assert [state_of(installed, i) for i in ids] == [3, 3, 3, 1, 1]


def test_checklist_55_groups_do_not_block_each_other(make_queue, installed):
    queue = make_queue()
    a = queue.publish("noop", serial_group="one")
    b = queue.publish("noop", serial_group="two")
    set_row(installed, a, state=2)
    assert queue.process_job(b) == "claimed"


def test_checklist_57_reread_after_lock(make_queue, installed):
    """A stale READY copy of a job that is PROCESSING in the database neither runs nor turns WAITING."""
    queue = make_queue()
    first = queue.publish("noop", serial_group="g")
    second = queue.publish("noop", serial_group="g")
    set_row(installed, second, state=2)  # already claimed elsewhere
    assert queue.process_job(second) == "unexpected"
    assert state_of(installed, second) == JobState.PROCESSING
    assert state_of(installed, first) == JobState.READY


def test_unknown_callback_at_process_time_fails_permanently(make_queue, installed, caplog):
    queue = make_queue(callbacks={"noop": lambda: None, "gone": lambda: None})
    job = queue.publish("gone")
    other = make_queue(callbacks={"noop": lambda: None})
    with caplog.at_level(logging.CRITICAL, logger="bgq"):
        other.process_job(job)
    assert state_of(installed, job) == JobState.PERMANENTLY_FAILED
    assert 'Callback "gone" does not exist.' in caplog.text


def test_finished_job_promotes_its_waiting_successor(make_queue, installed):
    """Checklist 58/59 at the Queue level: FINISHED promotes, TEMPORARILY_FAILED does not."""

    def fail():
        raise RuntimeError("x")

    queue = make_queue(callbacks={"noop": lambda: None, "fail": fail})
    first = queue.publish("fail", serial_group="g")
    second = queue.publish("noop", serial_group="g")
    assert queue.process_job(second) == "waiting"
    queue.process_job(first)
    assert state_of(installed, first) == JobState.TEMPORARILY_FAILED
    assert state_of(installed, second) == JobState.WAITING
    set_row(installed, first, callback_name="noop")
    queue.process_job(first)
    assert state_of(installed, first) == JobState.FINISHED
    row = _row(installed, second)
    assert row["state"] == JobState.READY and row["postponed_by"] is None


def test_a_result_write_that_deadlocks_once_is_retried_at_once_and_not_critical(
    make_queue, installed, caplog, monkeypatch
):
    """The callback has run: a retryable error on its result write (a deadlock, a cut session) is
    retried within a fraction of a second and logged at WARNING, never CRITICAL."""
    from bgq import DeadlockError

    queue = make_queue(callbacks={"rec": Recorder()})
    job = queue.publish("rec")
    real_finish, failures = queue.procs.finish, []

    def finish_once_deadlocked(*args, **kwargs):
        if not failures:
            failures.append(1)
            raise DeadlockError("Deadlock found when trying to get lock")
        return real_finish(*args, **kwargs)

    monkeypatch.setattr(queue.procs, "finish", finish_once_deadlocked)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="bgq"):
        assert queue.process_job(job) == "claimed"
    assert time.monotonic() - started < 1.0
    assert state_of(installed, job) == JobState.FINISHED
    warnings = [r for r in caplog.records if "Writing the result failed" in r.getMessage()]
    assert [r.levelno for r in warnings] == [logging.WARNING]
    assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL]
