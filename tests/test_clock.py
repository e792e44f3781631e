"""The `clock` option: bgq's time is the configured clock's, on both dialects, in every call that
reads time (the procedures' p_now, a new job's created_at, clear-finished's "today")."""

from __future__ import annotations

import datetime as dt

import pytest

from bgq import ConfigError, JobState, Queue
from tests.support.clock import Clock
from tests.support.helpers import count_rows, row, set_row, state_of, utc

START = dt.datetime(2031, 3, 4, 5, 6, 7, 891234, tzinfo=dt.UTC)


@pytest.mark.parametrize("clock", [5, "now", dt.datetime.now(dt.UTC)])
def test_a_clock_that_is_not_callable_is_refused(clock):
    with pytest.raises(ConfigError, match='Option "clock" must be callable or None'):
        Queue(callbacks={"noop": lambda: None}, clock=clock)


def test_no_clock_is_the_default():
    assert Queue(callbacks={"noop": lambda: None}).config.clock is None


@pytest.mark.parametrize("value", [dt.datetime(2031, 1, 1), "2031-01-01", None])
def test_a_clock_that_returns_no_aware_datetime_fails_before_anything_is_written(
    make_queue, installed, value
):
    queue = make_queue(clock=lambda: value)
    with pytest.raises(ConfigError, match='Option "clock" must return an aware datetime'):
        queue.publish("noop")
    assert count_rows(installed) == 0


def test_a_new_job_is_created_at_the_clock_s_time(make_queue, installed):
    queue = make_queue(clock=Clock(START))
    job = queue.publish("noop")
    found = row(installed, job)
    assert (found["created_at"], found["updated_at"]) == (START, START)


def test_jobs_inserted_in_bulk_are_created_at_the_clock_s_time(make_queue, installed):
    queue = make_queue(clock=Clock(START), bulk_size=10)
    with queue.bulk():
        for n in range(3):
            queue.publish("noop", [n])
    created = [utc(r["created_at"]) for r in installed.sql("SELECT created_at FROM {t} ORDER BY id")]
    assert created == [START] * 3


def test_a_clock_in_another_zone_is_written_as_utc(make_queue, installed):
    paris_summer = dt.timezone(dt.timedelta(hours=2))
    queue = make_queue(clock=lambda: START.astimezone(paris_summer))
    job = queue.publish("noop")
    assert row(installed, job)["created_at"] == START


def test_a_failed_job_runs_again_exactly_when_the_clock_passes_its_backoff(make_queue, installed):
    """The 1-minute backoff after the first failure, at its edge: 1 µs before, nothing runs."""
    clock, calls = Clock(START), []

    def flaky():
        calls.append(clock())
        if len(calls) == 1:
            raise RuntimeError("first time")

    queue = make_queue(callbacks={"flaky": flaky}, clock=clock)
    job = queue.publish("flaky")
    queue.process()
    failed = row(installed, job)
    assert (failed["state"], failed["last_attempt_at"], failed["postponed_by"]) == (4, START, 60_000)
    clock.advance(59.999999)
    queue.process()
    assert len(calls) == 1 and state_of(installed, job) == JobState.TEMPORARILY_FAILED
    clock.advance(0.000001)
    queue.process()
    assert calls == [START, START + dt.timedelta(seconds=60)]
    finished = row(installed, job)
    assert (finished["state"], finished["finished_at"]) == (
        JobState.FINISHED,
        START + dt.timedelta(seconds=60),
    )


def test_the_reaper_takes_a_job_once_the_clock_passes_stalled_job_timeout(make_queue, installed):
    clock = Clock(START)
    queue = make_queue(clock=clock, stalled_job_timeout=600)
    job = queue.publish("noop")
    with queue.database.transaction() as conn:
        assert queue.procs.claim(conn, job, "general", 4242, 1000, None).outcome == "claimed"
    assert row(installed, job)["updated_at"] == START
    clock.advance(600)
    assert queue.reaper.run_once() == []  # updated_at + 600 s is not older than 600 s
    clock.advance(0.000001)
    assert [r.id for r in queue.reaper.run_once()] == [job]
    reaped = row(installed, job)
    assert (reaped["state"], reaped["updated_at"]) == (JobState.TEMPORARILY_FAILED, clock())


def test_clear_finished_counts_days_from_the_clock_s_midnight(make_queue, installed):
    clock = Clock(dt.datetime(2031, 6, 10, 10, 0, tzinfo=dt.UTC))
    queue = make_queue(clock=clock)
    older = queue.publish("noop")
    newer = queue.publish("noop")
    set_row(installed, older, state=JobState.FINISHED, created_at=dt.datetime(2031, 6, 8, 23, 59))
    set_row(installed, newer, state=JobState.FINISHED, created_at=dt.datetime(2031, 6, 9, 0, 1))
    assert queue.clear_finished_jobs(days=1) == 1  # before 2031-06-09 00:00, by the clock
    assert (state_of(installed, older), state_of(installed, newer)) == (None, JobState.FINISHED)
