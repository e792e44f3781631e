"""Contract of {table}_monitor: the stuck-jobs report, always three rows (4, 5, 2)."""

from __future__ import annotations

from bgq.model import StuckJobs
from tests.support.helpers import T0, at, claimed, new_job, procs, set_row

DAY = 86400


def monitor(installed, now=T0, *, queue="general", long_s=DAY):
    with installed.db.transaction() as conn:
        return procs(installed).monitor(conn, queue, long_s, now)


def test_checklist_88_nothing_stuck_is_three_rows_of_zero(installed):
    assert monitor(installed) == [StuckJobs(4, 0, None), StuckJobs(5, 0, None), StuckJobs(2, 0, None)]
    new_job(installed)  # READY: not stuck
    assert [r.job_count for r in monitor(installed)] == [0, 0, 0]


def test_checklist_88_failed_jobs_are_counted_with_the_oldest_created_at(installed):
    for job_state, created in ((4, at(-50)), (4, at(-300)), (4, at(-10)), (5, at(-7000)), (5, at(-1))):
        job = new_job(installed)
        set_row(installed, job, state=job_state, created_at=created, updated_at=T0, last_attempt_at=T0)
    assert monitor(installed) == [
        StuckJobs(4, 3, at(-300)),
        StuckJobs(5, 2, at(-7000)),
        StuckJobs(2, 0, None),
    ]


def test_checklist_88_other_states_are_never_counted(installed):
    for job_state in (-1, 1, 3, 6, 7, 8):
        job = new_job(installed)
        set_row(installed, job, state=job_state, created_at=at(-10 * DAY), last_attempt_at=at(-10 * DAY))
    assert [r.job_count for r in monitor(installed)] == [0, 0, 0]


def test_checklist_88_long_run_is_measured_from_last_attempt_at_not_updated_at(installed):
    """A job started 2 days ago that keeps sending heartbeats counts; one started an hour ago does not."""
    hung = new_job(installed)
    claimed(installed, hung, now=at(-2 * DAY))
    set_row(installed, hung, updated_at=at(-5), created_at=at(-3 * DAY))  # fresh heartbeat
    recent = new_job(installed)
    claimed(installed, recent, now=at(-3600))
    set_row(installed, recent, created_at=at(-9 * DAY), updated_at=at(-10 * DAY))  # stale heartbeat
    report = monitor(installed)
    assert report[2] == StuckJobs(2, 1, at(-2 * DAY))


def test_checklist_88_the_24_hour_bound_is_strict_and_the_oldest_start_is_reported(installed):
    jobs = [new_job(installed) for _ in range(3)]
    claimed(installed, jobs[0], now=at(-DAY))  # exactly 24 h: not longer
    claimed(installed, jobs[1], now=at(-DAY - 1))
    claimed(installed, jobs[2], now=at(-DAY - 7200))
    assert monitor(installed)[2] == StuckJobs(2, 2, at(-DAY - 7200))
    assert monitor(installed, long_s=3600)[2] == StuckJobs(2, 3, at(-DAY - 7200))


def test_checklist_9_only_the_queue_and_its_sub_queues(installed):
    for queue in ("general", "general_x", "other", "generalx"):
        job = new_job(installed, queue=queue)
        set_row(installed, job, state=5, created_at=at(-1))
        running = new_job(installed, queue=queue)
        claimed(installed, running, queue=queue, now=at(-2 * DAY))
    assert [r.job_count for r in monitor(installed)] == [0, 2, 2]
    assert [r.job_count for r in monitor(installed, queue="other")] == [0, 1, 1]
    assert [r.job_count for r in monitor(installed, queue="general_x")] == [0, 1, 1]


def test_null_now_is_the_server_clock(installed):
    """Jobs claimed at T0 (2030) are in the future for the server's clock: no long run yet."""
    job = new_job(installed)
    claimed(installed, job, now=T0)
    old = new_job(installed)
    claimed(installed, old, now=T0.replace(year=2000))
    assert monitor(installed, now=None)[2] == StuckJobs(2, 1, T0.replace(year=2000))


def test_is_read_only(installed):
    job = new_job(installed)
    set_row(installed, job, state=4)
    before = installed.sql("SELECT * FROM {t}")
    monitor(installed)
    assert installed.sql("SELECT * FROM {t}") == before
