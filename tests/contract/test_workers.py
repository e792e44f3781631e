"""Contract of the worker procedures: {table}_worker_register / _heartbeat / _deregister / _reap.

A claimed job is linked to its worker by the jobs table's worker_id, which every claim procedure
writes from its p_worker_id.
"""

from __future__ import annotations

import pytest

from tests.support.helpers import (
    PID,
    T0,
    at,
    background,
    blocked_or_done,
    claimed,
    held_transaction,
    new_job,
    procs,
    row,
    states,
    utc,
)

DEAD_S = 30


def register(installed, *, now=T0, mode="work", queue="general", pid=777) -> int:
    with installed.db.transaction() as conn:
        return procs(installed).worker_register(conn, "host-a", pid, mode, queue, "9.9.9", now)


def beat(installed, worker_id, *, job=None, done=0, now=T0) -> bool:
    with installed.db.transaction() as conn:
        return procs(installed).worker_heartbeat(conn, worker_id, job, done, now)


def worker_rows(installed) -> dict[int, dict]:
    return {r["id"]: r for r in installed.sql("SELECT * FROM {t}_worker ORDER BY id")}


def worker_reap(installed, now, *, queue="general", dead_s=DEAD_S, limit=1000, backoff_ms=None):
    with installed.db.transaction() as conn:
        return procs(installed).worker_reap(conn, queue, dead_s, limit, now, backoff_ms=backoff_ms)


def test_register_heartbeat_deregister(installed):
    first, second = register(installed), register(installed, mode="consume", pid=778, now=at(1))
    assert second > first
    rows = worker_rows(installed)
    got = rows[first]
    assert (got["host"], got["pid"], got["mode"], got["queue"], got["version"]) == (
        "host-a", 777, "work", "general", "9.9.9",
    )  # fmt: skip
    assert utc(got["started_at"]) == utc(got["last_heartbeat_at"]) == T0
    assert (got["current_job_id"], got["jobs_done"]) == (None, 0)

    assert beat(installed, first, job=41, done=7, now=at(5)) is True
    got = worker_rows(installed)[first]
    assert (utc(got["last_heartbeat_at"]), got["current_job_id"], got["jobs_done"]) == (at(5), 41, 7)
    assert utc(got["started_at"]) == T0
    assert beat(installed, first, job=None, done=8, now=at(5)) is True  # same clock: still alive
    assert worker_rows(installed)[first]["current_job_id"] is None

    with installed.db.transaction() as conn:
        assert procs(installed).worker_deregister(conn, first) is True
    with installed.db.transaction() as conn:
        assert procs(installed).worker_deregister(conn, first) is False
    assert list(worker_rows(installed)) == [second]
    assert beat(installed, first, now=at(6)) is False  # a removed worker is not brought back
    assert list(worker_rows(installed)) == [second]


def test_workers_lists_the_queue_and_its_sub_queues(installed):
    mine = [register(installed), register(installed, queue="general_x")]
    register(installed, queue="other")
    register(installed, queue="generalx")  # a prefix only, not a sub-queue
    with installed.db.transaction() as conn:
        listed = procs(installed).workers(conn, "general")
    assert [w.id for w in listed] == mine
    assert listed[0].started_at == T0 and listed[1].queue == "general_x"


def test_a_bad_mode_is_refused_by_the_check(installed):
    with pytest.raises(Exception):  # noqa: B017 (the CHECK constraint: the driver's integrity error)
        register(installed, mode="nonsense")
    assert worker_rows(installed) == {}


def test_a_dead_worker_s_job_is_reaped_and_its_row_removed(installed):
    dead, alive = register(installed), register(installed, pid=778)
    job, other, unlinked = new_job(installed, group="g", priority=2), new_job(installed), new_job(installed)
    claimed(installed, job, now=T0, worker_id=dead)
    claimed(installed, other, now=T0, worker_id=alive)
    claimed(installed, unlinked, now=T0)
    assert beat(installed, alive, now=at(DEAD_S))  # alive's last heartbeat: T0 + 30 s

    assert worker_reap(installed, at(DEAD_S)) == []  # dead's heartbeat is exactly DEAD_S old: not yet
    reaped = worker_reap(installed, at(DEAD_S + 1))

    assert [(r.id, r.queue, r.priority, r.pid) for r in reaped] == [(job, "general", 2, 4242)]
    assert utc(reaped[0].stalled_since) == T0
    after = row(installed, job)
    assert after["state"] == 4
    assert after["error_message"] == (
        f"Job was stalled in the processing state since 2030-01-01 12:00:00.123456 (PID {PID}); "
        f"its worker {dead} stopped heartbeating."
    )
    assert (after["number_of_attempts"], after["postponed_by"], after["updated_at"]) == (
        1, 60000, at(DEAD_S + 1),
    )  # fmt: skip
    assert states(installed, other, unlinked) == [2, 2]  # a live worker's job; a job without worker
    assert list(worker_rows(installed)) == [alive]
    assert worker_reap(installed, at(DEAD_S + 2)) == []


def test_backoff_and_queue_filter(installed):
    dead = register(installed, queue="general")
    mine, foreign = new_job(installed, queue="general_sub"), new_job(installed, queue="other")
    for j, queue in ((mine, "general"), (foreign, "other")):
        claimed(installed, j, queue=queue, now=T0, worker_id=dead)
    reaped = worker_reap(installed, at(DEAD_S + 1), backoff_ms=0)
    assert [r.id for r in reaped] == [mine]
    assert row(installed, mine)["postponed_by"] == 0
    assert states(installed, mine, foreign) == [4, 2]
    # The worker row stays while a PROCESSING job still names it (here: one of another queue).
    assert list(worker_rows(installed)) == [dead]


def test_a_finished_job_is_not_reaped_and_an_idle_dead_worker_is_removed(installed):
    dead, idle = register(installed), register(installed, pid=779)
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0, worker_id=dead)
    with installed.db.transaction() as conn:
        procs(installed).finish(conn, job, attempt, 3, None, None, 1, None, at(1))
    assert worker_reap(installed, at(DEAD_S + 1)) == []
    assert states(installed, job) == [3]
    assert worker_rows(installed) == {}  # both dead workers are gone: no PROCESSING job names them
    assert idle


def test_worker_reap_never_waits_for_a_held_job_row_and_reaps_it_later(installed):
    """A frozen worker holds one of three jobs' rows in an open transaction: the reap returns at
    once with the other two, keeps the worker's row (a job still names it), and takes the third
    once the lock is gone."""
    dead = register(installed)
    jobs = [new_job(installed) for _ in range(3)]
    attempts = [claimed(installed, j, now=T0, worker_id=dead) for j in jobs]
    frozen = jobs[1]
    with background() as run, held_transaction(installed) as other:
        assert procs(installed).heartbeat(other, frozen, attempts[1], now=at(1)) is True
        reaper = run(worker_reap, installed, at(DEAD_S + 1))
        assert not blocked_or_done(installed, reaper), "the reap waited for the held row"
        assert sorted(r.id for r in reaper.result(timeout=5)) == sorted(set(jobs) - {frozen})
        other.rollback()
    assert list(worker_rows(installed)) == [dead]
    assert [r.id for r in worker_reap(installed, at(DEAD_S + 2))] == [frozen]
    assert states(installed, *jobs) == [4, 4, 4]
    assert worker_rows(installed) == {}


def test_worker_reap_skips_a_worker_row_held_by_its_heartbeat(installed):
    """A worker frozen inside its heartbeat transaction: its row is not deleted and not waited for."""
    dead = register(installed)
    with background() as run, held_transaction(installed) as other:
        assert procs(installed).worker_heartbeat(other, dead, None, 0, T0) is True
        reaper = run(worker_reap, installed, at(DEAD_S + 1))
        assert not blocked_or_done(installed, reaper), "the reap waited for the worker's row"
        assert reaper.result(timeout=5) == []
        other.rollback()
    assert list(worker_rows(installed)) == [dead]
    assert worker_reap(installed, at(DEAD_S + 1)) == []
    assert worker_rows(installed) == {}
