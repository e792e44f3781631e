"""Contract of {table}_due_jobs: which jobs process() takes, in cron and broker mode, and when."""

from __future__ import annotations

import pytest

from tests.support.helpers import T0, at, new_job, procs, set_row

ALL_STATES = (8, 1, 6, -1, 4, 2, 3, 5, 7)  # inserted in this order, so id order is not state order


def due(installed, *, broker=False, limit=1000, now=T0, queue="general"):
    with installed.db.transaction() as conn:
        return [(j.id, j.state) for j in procs(installed).due_jobs(conn, queue, broker, limit, now)]


def jobs_in_every_state(installed):
    ids = {}
    for job_state in ALL_STATES:
        job = new_job(installed)
        set_row(installed, job, state=job_state, created_at=at(-3600))
        ids[job_state] = job
    return ids


def test_cron_mode_takes_ready_failed_waiting_and_broker_failed_jobs_in_id_order(installed):
    ids = jobs_in_every_state(installed)
    expected = sorted((ids[s], s) for s in (1, 4, 6, 8))
    assert due(installed) == expected


def test_broker_mode_takes_back_to_broker_and_broker_failed_jobs(installed):
    ids = jobs_in_every_state(installed)
    assert due(installed, broker=True) == sorted((ids[s], s) for s in (-1, 8))


def test_limit(installed):
    ids = [new_job(installed) for _ in range(5)]
    for job in ids:
        set_row(installed, job, created_at=at(-10))
    assert [j for j, _ in due(installed, limit=3)] == ids[:3]


@pytest.mark.parametrize(
    ("created", "last_attempt", "postponed_by", "not_yet", "due_at"),
    [
        (0, None, None, -0.000001, 0),  # no delay: due from created_at on
        (0, None, 2500, 2.999, 3),  # ceil(2.5) = 3 s
        (0, None, 1, 0.5, 1),  # ceil(0.001) = 1 s
        (0, None, 1000, 0.999, 1),
        (0, 10, 1000, 10.999, 11),  # last_attempt_at is later: counts from it
        (10, 0, 1000, 10.999, 11),  # created_at is later: counts from it
        (5, None, None, 4.999, 5),  # created in the future of now
    ],
)
def test_availability_is_max_of_created_and_last_attempt_plus_ceil_seconds(
    installed, created, last_attempt, postponed_by, not_yet, due_at
):
    job = new_job(installed)
    set_row(
        installed,
        job,
        state=4,
        created_at=at(created),
        last_attempt_at=None if last_attempt is None else at(last_attempt),
        postponed_by=postponed_by,
    )
    assert due(installed, now=at(not_yet)) == []
    assert due(installed, now=at(due_at)) == [(job, 4)]


@pytest.mark.parametrize("job_state", [1, 4, 6, 8])
def test_processed_by_broker_ignores_the_delay(installed, job_state):
    delayed = new_job(installed, postponed_by=3_600_000, broker=True)
    plain = new_job(installed, postponed_by=3_600_000, broker=False)
    for job in (delayed, plain):
        set_row(installed, job, state=job_state, created_at=T0)
    assert due(installed, now=at(1)) == [(delayed, job_state)]


def test_back_to_broker_is_always_due_in_broker_mode(installed):
    back = new_job(installed, postponed_by=3_600_000)
    failed = new_job(installed, postponed_by=3_600_000)
    set_row(installed, back, state=-1, created_at=at(100))
    set_row(installed, failed, state=8, created_at=T0)
    assert due(installed, broker=True, now=T0) == [(back, -1)]
    assert due(installed, broker=True, now=at(3600)) == [(back, -1), (failed, 8)]


def test_sub_queues_are_included_and_look_alikes_are_not(installed):
    ids = {}
    for queue in ("general", "general_x", "generalx", "other", "General", "gen", "general_x_y"):
        job = new_job(installed, queue=queue)
        set_row(installed, job, created_at=at(-10))
        ids[queue] = job
    assert [j for j, _ in due(installed)] == [ids["general"], ids["general_x"], ids["general_x_y"]]
    assert [j for j, _ in due(installed, queue="gen")] == [ids["gen"]]


def test_due_jobs_changes_nothing(installed):
    job = new_job(installed)
    set_row(installed, job, created_at=at(-10))
    before = installed.sql("SELECT * FROM {t}")
    assert due(installed) == due(installed) == [(job, 1)]
    assert installed.sql("SELECT * FROM {t}") == before
