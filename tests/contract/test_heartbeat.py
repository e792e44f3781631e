"""Contract of {table}_heartbeat: a running job's updated_at moves to now, fenced on its claim token."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from bgq.sql.signatures import HEARTBEAT
from tests.support.helpers import (
    T0,
    at,
    background,
    blocked_or_done,
    claim,
    claimed,
    finish,
    held_transaction,
    new_job,
    procs,
    row,
    set_row,
    utc,
    wait_for_lock_wait,
)

TIMEOUT_S = 60


def heartbeat(installed, job_id, attempt, now=T0, conn=None):
    if conn is not None:
        return procs(installed).heartbeat(conn, job_id, attempt, now)
    with installed.db.transaction() as own:
        return procs(installed).heartbeat(own, job_id, attempt, now)


def reap(installed, now, conn=None):
    if conn is not None:
        return procs(installed).reap(conn, "general", TIMEOUT_S, 1000, now)
    with installed.db.transaction() as own:
        return procs(installed).reap(own, "general", TIMEOUT_S, 1000, now)


def test_a_running_job_is_alive_and_only_updated_at_moves(installed):
    job = new_job(installed, group="g")
    attempt = claimed(installed, job, now=T0)
    before = row(installed, job)

    assert heartbeat(installed, job, attempt, now=at(30)) is True

    after = row(installed, job)
    assert after["updated_at"] == at(30)
    assert {k: v for k, v in after.items() if k != "updated_at"} == {
        k: v for k, v in before.items() if k != "updated_at"
    }  # state, attempts, last_attempt_at, pid, ... are kept


def test_a_heartbeat_keeps_the_job_from_the_reaper(installed):
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)
    assert heartbeat(installed, job, attempt, now=at(TIMEOUT_S)) is True
    assert reap(installed, at(TIMEOUT_S + 1)) == []  # stalled since the claim, but alive since at(60)
    assert row(installed, job)["state"] == 2
    assert [r.id for r in reap(installed, at(2 * TIMEOUT_S + 1))] == [job]


def test_an_old_token_cannot_keep_a_reclaimed_job_alive(installed):
    """Reaped, then claimed again elsewhere: the first worker's token is fenced out."""
    job = new_job(installed)
    first = claimed(installed, job, now=T0)
    assert [r.id for r in reap(installed, at(TIMEOUT_S + 1))] == [job]
    second = claimed(installed, job, pid=5151, now=at(TIMEOUT_S + 2))
    assert (first, second) == (1, 2)
    before = row(installed, job)

    assert heartbeat(installed, job, first, now=at(TIMEOUT_S + 3)) is False

    assert row(installed, job) == before
    assert heartbeat(installed, job, second, now=at(TIMEOUT_S + 4)) is True
    assert row(installed, job)["updated_at"] == at(TIMEOUT_S + 4)


def test_a_token_that_was_never_issued_is_fenced_out(installed):
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)
    before = row(installed, job)
    assert heartbeat(installed, job, attempt + 1, now=at(1)) is False
    assert heartbeat(installed, job, attempt - 1, now=at(1)) is False
    assert row(installed, job) == before


@pytest.mark.parametrize("other_state", [-1, 1, 3, 4, 5, 6, 7, 8])
def test_a_job_that_is_not_processing_is_untouched(installed, other_state):
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)
    set_row(installed, job, state=other_state, updated_at=at(-7200))
    before = row(installed, job)
    assert heartbeat(installed, job, attempt, now=at(1)) is False
    assert row(installed, job) == before


def test_a_finished_job_is_untouched_and_a_heartbeat_does_not_disturb_the_finish(installed):
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)
    assert heartbeat(installed, job, attempt, now=at(1)) is True
    assert finish(installed, job, attempt, now=at(2)).finished  # the same token still owns it
    before = row(installed, job)
    assert (before["state"], before["updated_at"]) == (3, at(2))
    assert heartbeat(installed, job, attempt, now=at(3)) is False
    assert row(installed, job) == before


def test_missing_job_is_not_alive(installed):
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)
    assert heartbeat(installed, job + 1000, attempt, now=at(1)) is False
    assert row(installed, job)["updated_at"] == T0


def test_there_is_no_queue_filter(installed):
    job = new_job(installed, queue="other_queue")
    attempt = claimed(installed, job, queue="other_queue", now=T0)
    assert heartbeat(installed, job, attempt, now=at(1)) is True


def test_heartbeat_is_idempotent_and_alive_at_the_same_instant(installed):
    """A second call with the same clock changes nothing and still answers alive = 1."""
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)
    assert heartbeat(installed, job, attempt, now=T0) is True  # updated_at already T0
    assert heartbeat(installed, job, attempt, now=at(5)) is True
    before = row(installed, job)
    assert heartbeat(installed, job, attempt, now=at(5)) is True
    assert row(installed, job) == before


def test_alive_does_not_depend_on_the_clients_found_rows_flag(installed):
    """A DBA's console (MySQL: no CLIENT_FOUND_ROWS) gets alive = 1 for an unchanged updated_at too."""
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)
    url = sa.make_url(installed.url)
    sql = installed.db.dialect.call_sql(installed.table, HEARTBEAT)
    if installed.db.dialect.name == "mysql":
        import pymysql

        conn = pymysql.connect(
            host=url.host, port=url.port or 3306, user=url.username, password=url.password or "",
            database=url.database, autocommit=False,
        )  # fmt: skip
    else:
        import psycopg

        conn = psycopg.connect(
            host=url.host, port=url.port or 5432, user=url.username, password=url.password,
            dbname=url.database,
        )  # fmt: skip
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql, (job, attempt, None, T0))  # updated_at is T0 already: no row changes
            rows = [tuple(r) for r in cursor.fetchall()]
            while cursor.nextset():  # MySQL: the CALL's status result
                pass
        conn.commit()
    finally:
        conn.close()
    assert rows == [(1, 0, None)]  # alive, no abort requested
    assert row(installed, job)["updated_at"] == T0


def test_a_heartbeat_holding_the_row_makes_a_concurrent_reaper_skip_it(installed):
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)
    with background() as run, held_transaction(installed) as worker:
        assert heartbeat(installed, job, attempt, now=at(TIMEOUT_S + 1), conn=worker) is True
        reaper = run(reap, installed, at(TIMEOUT_S + 2))
        assert not blocked_or_done(installed, reaper), "the reaper waited for the heartbeat's row"
        assert reaper.result(timeout=5) == []
        worker.commit()
    assert reap(installed, at(TIMEOUT_S + 2)) == []
    after = row(installed, job)
    assert (after["state"], after["updated_at"], after["error_message"]) == (2, at(TIMEOUT_S + 1), None)


def test_a_reaper_holding_the_row_wins_over_a_concurrent_heartbeat(installed):
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)
    with background() as run, held_transaction(installed) as reaper:
        assert [r.id for r in reap(installed, at(TIMEOUT_S + 1), conn=reaper)] == [job]
        beat = run(heartbeat, installed, job, attempt, at(TIMEOUT_S + 2))
        wait_for_lock_wait(installed)  # the heartbeat waits for the reaped row
        reaper.commit()
        assert beat.result(timeout=30) is False
    after = row(installed, job)
    assert (after["state"], after["updated_at"]) == (4, at(TIMEOUT_S + 1))


def test_now_null_uses_the_server_clock(installed):
    job = new_job(installed)
    attempt = claimed(installed, job, now=T0)
    set_row(installed, job, updated_at=at(-7200))
    clock = f"SELECT {installed.db.dialect.now_sql()} AS now"
    before = utc(installed.sql(clock)[0]["now"])
    assert heartbeat(installed, job, attempt, now=None) is True
    after = utc(installed.sql(clock)[0]["now"])
    assert before <= row(installed, job)["updated_at"] <= after


def test_returned_columns(installed):
    job = new_job(installed)
    assert claim(installed, job, now=T0).outcome == "claimed"
    with installed.db.transaction() as conn:
        sql = installed.db.dialect.call_sql(installed.table, HEARTBEAT)
        result = conn.exec_driver_sql(sql, (job, 1, None, at(1)))
        assert list(result.keys()) == ["alive", "abort_requested", "reason"]
        assert [tuple(r) for r in result.all()] == [(1, 0, None)]
