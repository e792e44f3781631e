"""Contract of schema.sql: the last lines of defence (unique running group, CHECKs), indexes, meta."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from bgq.model import JobState, Mode
from bgq.sql.install import SCHEMA_VERSION
from tests.support.helpers import (
    T0,
    background,
    blocked_or_done,
    claim,
    claimed,
    finish,
    held_transaction,
    new_job,
    old_snapshot,
    state,
    states,
)

_INSERT = (
    "INSERT INTO {t} (queue, priority, callback_name, state, serial_group, mode, created_at, updated_at) "
    "VALUES ('general', 1, 'cb', %s, %s, %s, %s, %s)"
)


def insert_raw(installed, job_state, group=None, mode="normal"):
    installed.sql(_INSERT, (job_state, group, mode, T0, T0))


def count(installed):
    return int(installed.sql("SELECT COUNT(*) AS n FROM {t}")[0]["n"])


_NO_BACKSTOP = dict(
    mysql="accepted",
    postgres="rejected",
    reason="InnoDB's unique check takes gap locks: MySQL's running_group index is plain (migration 0007)",
)


def _written(write):
    """'rejected' if the write breaks a constraint, else 'accepted'."""
    try:
        write()
    except sa.exc.IntegrityError:
        return "rejected"
    return "accepted"


@pytest.mark.dialect_differs(**_NO_BACKSTOP)
def test_second_processing_row_of_a_group_by_hand(installed, dialect_expects):
    """Behind the procedures' group lock, PostgreSQL's partial unique index also refuses a second
    PROCESSING row of a group written by hand.

    Dialect exception (MySQL/MariaDB): the running_group index is not unique, because InnoDB's
    duplicate check would take gap locks that make claims of other groups and publishes wait
    (tests/contract/test_claim.py::test_claims_of_different_groups_never_wait_for_each_other).
    Only the procedures keep a group to one PROCESSING job there; a raw write can break it.
    """
    insert_raw(installed, 2, "g")
    assert _written(lambda: insert_raw(installed, 2, "g")) == dialect_expects
    assert count(installed) == {"rejected": 1, "accepted": 2}[dialect_expects]


@pytest.mark.dialect_differs(**_NO_BACKSTOP)
def test_update_to_a_second_processing_row_of_a_group_by_hand(installed, dialect_expects):
    """As above, for an UPDATE by hand of a job beside a claimed one (see that test for MySQL)."""
    running = new_job(installed, group="g")
    other = new_job(installed, group="g")
    claimed(installed, running)
    update = lambda: installed.sql("UPDATE {t} SET state = 2 WHERE id = %s", (other,))  # noqa: E731
    assert _written(update) == dialect_expects
    assert state(installed, other) == {"rejected": 1, "accepted": 2}[dialect_expects]


def test_processing_rows_of_different_groups_or_of_no_group_are_fine(installed):
    insert_raw(installed, 2, "g")
    insert_raw(installed, 2, "h")
    insert_raw(installed, 2, "G")  # names compare byte-wise
    insert_raw(installed, 2, None)
    insert_raw(installed, 2, None)
    for other_state in (-1, 1, 3, 4, 5, 6, 7, 8, 3, 6):
        insert_raw(installed, other_state, "g")
    assert count(installed) == 15


@pytest.mark.parametrize("bad_state", [9, 0, -2])
def test_state_check_rejects_unknown_states(installed, bad_state):
    with pytest.raises(sa.exc.DBAPIError) as caught:
        insert_raw(installed, bad_state)
    assert f"{installed.table}_state_check" in str(caught.value)
    assert count(installed) == 0


def test_state_check_accepts_every_job_state(installed):
    for job_state in JobState:
        insert_raw(installed, int(job_state))
    assert count(installed) == len(JobState)


def test_mode_check(installed):
    for mode in Mode:
        insert_raw(installed, 1, mode=mode.value)
    with pytest.raises(sa.exc.DBAPIError) as caught:
        insert_raw(installed, 1, mode="bogus")
    assert f"{installed.table}_mode_check" in str(caught.value)
    assert count(installed) == len(Mode)


def _index_names(installed):
    if installed.db.dialect.name == "mysql":
        rows = installed.sql(
            "SELECT DISTINCT index_name AS name FROM information_schema.statistics "
            "WHERE table_schema = DATABASE() AND table_name IN (%s, %s)",
            (installed.table, f"{installed.table}_group"),
        )
    else:
        rows = installed.sql(
            "SELECT indexname AS name FROM pg_indexes WHERE tablename IN (%s, %s)",
            (installed.table, f"{installed.table}_group"),
        )
    return {r["name"] for r in rows}


def test_indexes_of_the_hot_queries_exist(installed):
    suffixes = ("running_group", "pending_head", "ungrouped", "state", "identifier", "group_waiting")
    assert {f"{installed.table}_{s}" for s in suffixes} <= _index_names(installed)


def test_installed_version_is_recorded(installed):
    meta = {r["name"]: r["value"] for r in installed.sql("SELECT name, value FROM {t}_meta")}
    assert meta["version"] == SCHEMA_VERSION
    assert len(meta["checksum"]) == 16


def test_publish_never_waits_for_a_claim_in_progress(installed):
    """A publish (insert) must not queue behind a worker's open claim of a group that ran before.

    The group's finished job leaves an old entry in the running_group index that a long reader
    elsewhere keeps from being purged. On MySQL a UNIQUE index there took a gap lock beside it in
    the claim's duplicate check, and a new row's NULL key fell into that gap, so the insert waited
    for the claim transaction (migration 0007_running_group_key made it a plain index).
    """
    with old_snapshot(installed):  # a long reader elsewhere keeps old row versions
        earlier = new_job(installed, group="g")
        assert finish(installed, earlier, claimed(installed, earlier)).finished
        job = new_job(installed, group="g")
        with background() as run, held_transaction(installed) as worker:
            assert claim(installed, job, conn=worker).outcome == "claimed"
            publishes = [run(new_job, installed, group=group) for group in ("other", None)]
            blocked = [blocked_or_done(installed, publish) for publish in publishes]
            worker.commit()
        published = [publish.result(timeout=5) for publish in publishes]
    assert blocked == [False, False], "a publish waited for an open claim"
    assert states(installed, *published) == [1, 1]
