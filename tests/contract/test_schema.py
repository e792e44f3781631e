"""Contract of schema.sql: the last lines of defence (unique running group, CHECKs), indexes, meta."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from bgq.install import SCHEMA_VERSION
from bgq.model import JobState, Mode
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
)

_INSERT = (
    "INSERT INTO {t} (queue, priority, callback_name, state, serial_group, mode, created_at, updated_at) "
    "VALUES ('general', 1, 'cb', %s, %s, %s, %s, %s)"
)


def insert_raw(installed, job_state, group=None, mode="normal"):
    installed.sql(_INSERT, (job_state, group, mode, T0, T0))


def count(installed):
    return int(installed.sql("SELECT COUNT(*) AS n FROM {t}")[0]["n"])


def test_second_processing_row_of_a_group_is_rejected(installed):
    insert_raw(installed, 2, "g")
    with pytest.raises(sa.exc.IntegrityError):
        insert_raw(installed, 2, "g")
    assert count(installed) == 1


def test_update_to_a_second_processing_row_of_a_group_is_rejected(installed):
    running = new_job(installed, group="g")
    other = new_job(installed, group="g")
    claimed(installed, running)
    with pytest.raises(sa.exc.IntegrityError):
        installed.sql("UPDATE {t} SET state = 2 WHERE id = %s", (other,))
    assert state(installed, other) == 1


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


@pytest.mark.dialect_differs(
    mysql={True, False},
    postgres={False},
    reason="InnoDB's duplicate check on running_group may take a gap lock, while the purge lags",
)
def test_publish_never_waits_for_a_claim_in_progress(installed, dialect_expects):
    """A publish (insert) must not queue behind a worker's open claim of a group that ran before.

    Dialect exception (InnoDB): the unique index on running_group takes a gap lock in its duplicate
    check beside the group's old, not yet purged entry, and a new row's NULL key can fall into that
    gap, so on MySQL the insert may wait for the claim *transaction* (bgq commits it at once);
    whether it does depends on how far the purge has got, so both are allowed there. On both
    dialects it never waits for the job itself: it completes as soon as the claim commits.
    """
    with old_snapshot(installed):  # a long reader elsewhere keeps old row versions
        earlier = new_job(installed, group="g")
        assert finish(installed, earlier, claimed(installed, earlier)).finished
        job = new_job(installed, group="g")
        with background() as run, held_transaction(installed) as worker:
            assert claim(installed, job, conn=worker).outcome == "claimed"
            publish = run(new_job, installed, group="other")
            blocked = blocked_or_done(installed, publish)
            worker.commit()
        published = publish.result(timeout=5)  # the claim has committed: nothing holds it now
    assert blocked in dialect_expects, "whether the insert of a new job waited for an open claim"
    assert state(installed, published) == 1
