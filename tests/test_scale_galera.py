"""Galera (docs/scale-out/galera.md): what bgq needs from a multi-writer cluster.

On the machine's single MariaDB: the error mapping and retry of a certification failure (1213,
shown with a real deadlock) and of a node that is not ready (1047, raised by a real SIGNAL), the
install lock without GET_LOCK, and that every claiming procedure writes the group row it claims
for (a write that really changes the row: Galera certifies writes, not locks). On a real
three-node cluster that the last test starts itself (tools/scale/galera.py, ~30 s): workers on
all three nodes, one URL per node, claiming one group and a few groups, judged by their own
ledger: no overlap inside a group, every job once, in order.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pymysql
import pytest
import sqlalchemy as sa

from bgq.db import Database
from bgq.errors import DeadlockError, LockTimeoutError, NodeNotReadyError
from bgq.model import JobResult
from bgq.sql import retry
from bgq.sql.calls import Procs
from bgq.sql.install import install
from bgq.sql.migrations import install_lock
from tests.conftest import DATABASE_URLS
from tests.support.helpers import (
    PID,
    QUEUE,
    T0,
    WAITING_MS,
    claim,
    claim_batch,
    claimed,
    group_row,
    hand_off,
    new_job,
    procs,
    session_id,
    set_row,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[1]
MYSQL_URL = DATABASE_URLS["mysql"]


@pytest.fixture
def dialect() -> str:
    """These tests are about MariaDB Galera: the machine's single MariaDB."""
    return "mysql"


# --- error mapping and retry ---


def test_1047_is_a_retryable_node_not_ready_error():
    db = Database(MYSQL_URL)
    try:
        exc = pymysql.err.OperationalError(1047, "WSREP has not yet prepared node for application use")
        error = db.translate(exc)
        assert type(error) is NodeNotReadyError and error.retryable
        assert "WSREP has not yet prepared node" in str(error)
        cut_off = db.translate(
            pymysql.err.OperationalError(
                1180,
                "Error while appending streaming replication fragment"
                "(provider status: Not connected to Primary Component)",
            )
        )
        assert type(cut_off) is NodeNotReadyError and cut_off.retryable
        deadlock = db.translate(pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock"))
        assert type(deadlock) is DeadlockError and deadlock.retryable
    finally:
        db.dispose()


def test_a_node_not_ready_drops_its_session_and_the_retry_succeeds_with_one_warning(caplog):
    """A real 1047 from the server (a SIGNAL with that number, as a joining Galera node answers):
    the retry runs on a new session, and the log says so once."""
    db = Database(MYSQL_URL)
    sessions: list[int] = []

    def call(conn: sa.Connection) -> int:
        sessions.append(session_id(conn))
        if len(sessions) == 1:
            conn.exec_driver_sql(
                "SIGNAL SQLSTATE '08S01' SET MYSQL_ERRNO = 1047,"
                " MESSAGE_TEXT = 'WSREP has not yet prepared node for application use'"
            )
        return int(conn.exec_driver_sql("SELECT 1").scalar_one())

    try:
        with caplog.at_level(logging.WARNING, logger="bgq"):
            assert retry.in_transaction(db, call) == 1
        assert len(sessions) == 2 and sessions[0] != sessions[1]  # the refused session was dropped
        lines = [
            r.getMessage()
            for r in caplog.records
            if "not ready" in r.getMessage() or "retrying" in r.getMessage()
        ]
        assert len([m for m in lines if "reconnecting" in m]) == 1, lines
        assert len([m for m in lines if "retrying the transaction" in m]) == 1, lines
    finally:
        db.dispose()


def test_a_node_that_stays_not_ready_gives_up_after_the_bounded_tries():
    db = Database(MYSQL_URL)
    calls = []

    def call(conn: sa.Connection) -> None:
        calls.append(1)
        conn.exec_driver_sql(
            "SIGNAL SQLSTATE '08S01' SET MYSQL_ERRNO = 1047, MESSAGE_TEXT = 'WSREP has not yet prepared node'"
        )

    try:
        with pytest.raises(NodeNotReadyError):
            retry.in_transaction(db, call, tries=3)
        assert len(calls) == 3
    finally:
        db.dispose()


def test_a_real_deadlock_at_commit_time_is_retried_and_both_transactions_commit():
    """Two transactions that write two rows in opposite order: the server rolls one back (1213,
    what a Galera certification failure also raises) and bgq's retry runs it again."""
    table = f"bgqt_dl_{uuid.uuid4().hex[:8]}"
    db = Database(MYSQL_URL)
    with db.engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {table} (id INT PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB")
        conn.exec_driver_sql(f"INSERT INTO {table} VALUES (1, 0), (2, 0)")
    first_done = threading.Barrier(2, timeout=10)
    tries: dict[str, int] = {"a": 0, "b": 0}

    def writer(name: str, order: tuple[int, int]) -> None:
        def call(conn: sa.Connection) -> None:
            tries[name] += 1
            conn.exec_driver_sql(f"UPDATE {table} SET n = n + 1 WHERE id = %s", (order[0],))
            if tries[name] == 1:
                first_done.wait()
            conn.exec_driver_sql(f"UPDATE {table} SET n = n + 1 WHERE id = %s", (order[1],))

        retry.in_transaction(db, call)

    try:
        threads = [
            threading.Thread(target=writer, args=("a", (1, 2))),
            threading.Thread(target=writer, args=("b", (2, 1))),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        with db.engine.begin() as conn:
            assert conn.exec_driver_sql(f"SELECT SUM(n) FROM {table}").scalar_one() == 4
        assert sorted(tries.values()) == [1, 2], tries  # one was rolled back and ran again
    finally:
        with db.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
        db.dispose()


# --- the install lock: a row, not GET_LOCK ---


def test_no_get_lock_anywhere_in_bgq():
    """GET_LOCK holds on one server only: on Galera two nodes would both hold it."""
    sources = [*(ROOT / "bgq").rglob("*.py"), *(ROOT / "db" / "mysql").rglob("*.sql")]
    used = [str(p) for p in sources if re.search(r"\bGET_LOCK\s*\(", p.read_text(), re.IGNORECASE)]
    assert used == []


@pytest.fixture
def lock_db():
    db = Database(MYSQL_URL)
    table = f"bgqt_il_{uuid.uuid4().hex[:8]}"
    yield db, table
    with db.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM bgq_install_lock WHERE name = %s", (table,))
    db.dispose()


def _lock_row(db: Database, table: str) -> Any:
    with db.engine.begin() as conn:
        return conn.exec_driver_sql(
            "SELECT holder, expires_at > UTC_TIMESTAMP(6) AS live FROM bgq_install_lock WHERE name = %s",
            (table,),
        ).first()


def test_the_install_lock_is_a_committed_row_that_a_second_install_waits_for(lock_db):
    db, table = lock_db
    other = Database(MYSQL_URL)
    try:
        with install_lock(db, table):
            row = _lock_row(other, table)  # another session (another node) sees it: it is committed
            assert row is not None and row.live
            with (
                pytest.raises(LockTimeoutError, match="Another `bgq install-procs` is running"),
                install_lock(other, table, wait=0.5),
            ):
                pass
        assert _lock_row(other, table) is None  # released
        with install_lock(other, table, wait=1):
            pass
    finally:
        other.dispose()


def test_a_killed_installs_lock_row_is_taken_over_once_its_lease_expired(lock_db):
    db, table = lock_db
    with install_lock(db, table):
        pass
    with db.engine.begin() as conn:  # what a SIGKILLed install leaves: a row nobody refreshes
        conn.exec_driver_sql(
            "INSERT INTO bgq_install_lock VALUES (%s, 'dead host pid 1', UTC_TIMESTAMP(6),"
            " UTC_TIMESTAMP(6) + INTERVAL 2 SECOND)",
            (table,),
        )
    started = time.monotonic()
    with install_lock(db, table, wait=10):
        assert "dead host" not in _lock_row(db, table).holder
    assert 1.0 < time.monotonic() - started < 8


def test_the_install_keeps_its_lease_while_it_runs(lock_db):
    db, table = lock_db
    with install_lock(db, table, lease=2):
        time.sleep(3)  # real: the install runs longer than the lease, which it refreshes every lease / 6
        row = _lock_row(db, table)
        assert row is not None and row.live


# --- every claim writes the group row ---

#: The MySQL procedures that claim a grouped job, and how each writes the group row.
CLAIMING = ("claim", "claim_ids", "claim_batch", "claim_job", "claim_heads", "hand_off")


@pytest.mark.parametrize("name", [*CLAIMING, "finish_results"])
def test_the_header_states_the_group_row_rule(name):
    text = (ROOT / "db" / "mysql" / f"{name}.sql").read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("--"))
    assert "Group row" in header and "certif" in header, name


@pytest.mark.parametrize("name", ["claim_job", "hand_off", "finish_results", "claim_heads"])
def test_every_group_row_upsert_really_changes_the_row(name):
    """An ON DUPLICATE KEY UPDATE that sets the row to what it is (updated_at = the caller's
    clock) is no write on Galera: each one must be group_touch."""
    text = (ROOT / "db" / "mysql" / f"{name}.sql").read_text()
    code = "\n".join(re.sub(r"--.*$", "", line) for line in text.splitlines())
    for statement in re.findall(r"INSERT\s+INTO\s+\{\{ table \}\}_group\b.*?;", code, re.S):
        assert "IGNORE" in statement.split("INTO")[0] or "{{ group_touch() }}" in statement, statement
    if name == "claim_heads":
        assert re.search(r"'UPDATE ' ~ table ~ '_group SET ' ~ group_touch", code)


# Each test gives group g (h) a row whose updated_at is T0, the clock every call uses: a claim
# that only locked the row, or upserted it to the same value, would leave it as it is.


def _touched(installed: Any, group: str) -> bool:
    row = group_row(installed, group)
    assert row is not None
    return row["updated_at"] > T0.replace(tzinfo=None)


def _set_group(installed: Any, group: str) -> None:
    installed.sql(
        "UPDATE {t}_group SET updated_at = %s WHERE serial_group = %s", (T0.replace(tzinfo=None), group)
    )


def test_claim_writes_the_group_row(installed):
    first, second = new_job(installed, group="g"), new_job(installed, group="g")
    attempt = claimed(installed, first)
    hand_off(installed, [], [JobResult(first, attempt, 3)])  # group free again
    _set_group(installed, "g")
    assert claim(installed, second).outcome == "claimed"
    assert _touched(installed, "g")


def test_claim_batch_writes_the_group_rows_of_the_heads_it_claims(installed):
    for group in ("g", "h"):
        job = new_job(installed, group=group)
        claimed(installed, job)
        set_row(installed, job, state=3)
        new_job(installed, group=group)
        _set_group(installed, group)
    got = claim_batch(installed, 10)
    assert len(got) == 2
    assert _touched(installed, "g") and _touched(installed, "h")


def test_hand_off_writes_the_group_row_of_the_head_it_claims_the_short_way(installed):
    first, second = new_job(installed, group="g"), new_job(installed, group="g")
    attempt = claimed(installed, first)
    _set_group(installed, "g")
    written, heads = hand_off(installed, "g", [JobResult(first, attempt, 3)])
    assert written == {first: True} and [h.id for h in heads] == [second]
    assert _touched(installed, "g")


def test_hand_off_writes_the_group_row_of_another_groups_head(installed):
    first = new_job(installed, group="g")
    other = new_job(installed, group="h")
    attempt = claimed(installed, first)
    claimed_other = claim(installed, other)  # h's row exists now
    hand_off(installed, [], [JobResult(other, claimed_other.attempt or 0, 3)])
    new_h = new_job(installed, group="h")
    _set_group(installed, "h")
    _, heads = hand_off(installed, ["g", "h"], [JobResult(first, attempt, 3)])
    assert new_h in [h.id for h in heads]
    assert _touched(installed, "h")


def test_claim_ids_writes_the_group_row(installed):
    first, second = new_job(installed, group="g"), new_job(installed, group="g")
    attempt = claimed(installed, first)
    hand_off(installed, [], [JobResult(first, attempt, 3)])
    _set_group(installed, "g")
    with installed.db.transaction() as conn:
        (got,) = procs(installed).claim_ids(conn, [second], QUEUE, PID, WAITING_MS, T0)
    assert got[1].outcome == "claimed"
    assert _touched(installed, "g")


# --- a real cluster: workers on three nodes at once ---


def _cluster_available() -> str | None:
    for what in ("mariadbd", "mariadb-install-db", "haproxy", "rsync"):
        if shutil.which(what) is None and not Path(f"/usr/sbin/{what}").exists():
            return f"{what} is not installed (tools/scale/galera.py installs it: make scale)"
    if not Path("/usr/lib/galera/libgalera_smm.so").exists():
        return "galera-4 is not installed"
    return None


@pytest.fixture(scope="module")
def cluster():
    missing = _cluster_available()
    if missing and os.environ.get("CI") == "true":  # make test installs them (tools.scale --packages-only)
        pytest.fail(f"CI=true and {missing}", pytrace=False)
    if missing:
        pytest.skip(missing)
    from tools.scale.galera import Galera

    workdir = Path(tempfile.mkdtemp(prefix="bgqtest-galera-"))
    topology = Galera(workdir)
    try:
        topology.start()
        yield topology
    finally:
        topology.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _cert_conflicts(db: Database) -> int:
    """This node's certification failures and brute-force aborts so far (both a 1213 to bgq)."""
    with db.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_local_cert_failures', 'wsrep_local_bf_aborts')"
        ).all()
    return sum(int(value) for _, value in rows)


@pytest.mark.slow
def test_workers_on_three_nodes_never_overlap_inside_a_group(cluster):
    """Six workers, two per node, each on its own node's URL (no haproxy), claim and hand off
    jobs of one hot group and of three more: by their own ledger (start and end of each job,
    taken between the claim's and the finish's commits), no two jobs of a group ever overlap,
    every job runs once, each group in id order; certification conflicts were there and retried."""
    database = f"bgqt_galera_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(cluster.admin_url())
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {database}")
    table = "jobs"
    dbs = [Database(url) for url in cluster.node_urls(database)]
    ledger: list[tuple[str, int, float, float, int]] = []  # group, job, start, end, node
    conflicts = [0]
    lock = threading.Lock()
    groups = ["hot"] * 40 + [f"g{i}" for i in range(3) for _ in range(15)]
    try:
        install(dbs[0], table)
        ids: dict[str, list[int]] = {}
        p0 = Procs(dbs[0], table)
        from bgq.model import NewJob

        with dbs[0].transaction() as conn:
            for group in groups:
                job = NewJob(
                    queue=QUEUE, priority=1, callback_name="cb", parameters_json="[]", parameters=None,
                    serial_group=group, coalesce_threshold=None, identifier=None, mode="normal",
                    postponed_by=None, processed_by_broker=False,
                )  # fmt: skip
                ids.setdefault(group, []).append(p0.insert(conn, job))
        total = len(groups)

        def applied(db: Database) -> bool:
            with db.engine.connect() as conn:
                return conn.exec_driver_sql(f"SELECT COUNT(*) FROM {table}").scalar() == total

        wait_until(lambda: all(applied(db) for db in dbs), "the inserts applied on every node", 30, 0.05)
        deadline = time.monotonic() + 120

        def worker(node: int) -> None:
            db = dbs[node]
            p = Procs(db, table)
            held: list[Any] = []
            rng = random.Random(node)
            while time.monotonic() < deadline:
                with lock:
                    if len(ledger) >= total:
                        return
                try:
                    if held:
                        job = held.pop()
                        start = time.monotonic()
                        time.sleep(
                            0.002
                        )  # real: the job's run time, which no other job of its group may overlap
                        end = time.monotonic()
                        result = JobResult(job.id, job.claim.attempt or 0, 3)
                        # Half the hand-offs keep the group (as `bgq work` does), half let it go:
                        # then every worker's claim_batch races for its head, on all nodes.
                        keep = [job.claim.serial_group] if rng.random() < 0.5 else []

                        def write(
                            conn: sa.Connection,
                            result: JobResult = result,
                            keep: list[str] = keep,
                        ) -> Any:
                            return p.hand_off(conn, [result], keep, QUEUE, PID, None, None, WAITING_MS)

                        written, heads = retry.in_transaction(db, write, tries=20)
                        assert written == {job.id: True}
                        with lock:
                            ledger.append((job.claim.serial_group, job.id, start, end, node))
                        held.extend(heads)
                    else:
                        got = retry.in_transaction(
                            db,
                            lambda conn: p.claim_batch(conn, QUEUE, 2, PID, None, None, WAITING_MS),
                            tries=20,
                        )
                        if not got:
                            time.sleep(0.02)  # real: an idle worker's poll interval (nothing claimable yet)
                        held.extend(got)
                except DeadlockError:
                    with lock:
                        conflicts[0] += 1

        before = [_cert_conflicts(db) for db in dbs]
        threads = [threading.Thread(target=worker, args=(n % 3,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=150)
        by_group: dict[str, list[tuple[float, float, int]]] = {}
        for group, job, start, end, _ in ledger:
            by_group.setdefault(group, []).append((start, end, job))
        overlaps = []
        for group, runs in by_group.items():
            runs.sort()
            overlaps += [(group, a, b) for a, b in zip(runs, runs[1:], strict=False) if b[0] < a[1]]
            assert [job for _, _, job in runs] == ids[group], f"group {group} out of order"
        assert overlaps == []
        assert sorted(job for _, job, _, _, _ in ledger) == sorted(j for js in ids.values() for j in js)
        assert {node for *_, node in ledger} == {0, 1, 2}  # every node took work
        with dbs[0].transaction() as conn:
            left = conn.exec_driver_sql(f"SELECT COUNT(*) FROM {table} WHERE state <> 3").scalar_one()
        assert left == 0
        certified = sum(_cert_conflicts(db) for db in dbs) - sum(before)
        print(f"galera: {len(ledger)} jobs on 3 nodes, 0 overlaps, {certified} certification conflicts or"
              f" brute-force aborts (retried), {conflicts[0]} gave up after 20 tries")  # fmt: skip
    finally:
        for db in dbs:
            db.dispose()
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {database}")
        admin.dispose()


def test_a_plain_mariadb_session_needs_no_causal_sync():
    """wsrep_on is 0 on the machine's single MariaDB: no extra statement in bgq's transactions."""
    db = Database(MYSQL_URL)
    try:
        sent: list[str] = []
        sa.event.listen(db.engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
        with db.transaction() as conn:
            conn.exec_driver_sql("SELECT 2")
        assert sent == ["SELECT 2"]
    finally:
        db.dispose()


@pytest.mark.slow
def test_a_result_written_on_another_node_right_after_the_claim_is_never_dropped(cluster):
    """The claim commits on node 1; the result is written at once on node 2 (as haproxy may put
    two transactions of one worker on two nodes). Node 2 applies node 1's commits after they
    return, so without a causal wait its finish could read the job as not yet claimed and
    drop the result as "taken over" (the job would run again after the reaper's timeout).
    bgq's Galera sessions wait (wsrep_sync_wait = 1, and each transaction opens with a SELECT)."""
    database = f"bgqt_galera_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(cluster.admin_url())
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {database}")
    table = "jobs"
    one, two = (Database(url) for url in cluster.node_urls(database)[:2])
    try:
        install(one, table)
        sent: list[str] = []
        sa.event.listen(two.engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
        with two.transaction() as conn:
            assert conn.exec_driver_sql("SELECT @@SESSION.wsrep_sync_wait").scalar_one() == 1
        assert sent[0] == "SELECT 1"  # the transaction's first statement is the causal wait
        p1, p2 = Procs(one, table), Procs(two, table)
        from bgq.model import NewJob

        routines = "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE()"
        with one.transaction() as conn:
            installed = conn.exec_driver_sql(routines).scalar_one()

        def applied_on_two() -> bool:
            with two.transaction() as conn:
                return bool(conn.exec_driver_sql(routines).scalar_one() == installed)

        wait_until(applied_on_two, "the install applied on node 2", 30)
        dropped = []
        for n in range(200):
            with one.transaction() as conn:
                job = NewJob(
                    queue=QUEUE, priority=1, callback_name="cb", parameters_json="[]", parameters=None,
                    serial_group=None, coalesce_threshold=None, identifier=None, mode="normal",
                    postponed_by=None, processed_by_broker=False,
                )  # fmt: skip
                p1.insert(conn, job)
            got = retry.in_transaction(
                one, lambda c: p1.claim_batch(c, QUEUE, 1, PID, None, None, WAITING_MS)
            )
            assert len(got) == 1, f"round {n}: the job was not claimed on node 1"
            (claimed_job,) = got
            result = JobResult(claimed_job.id, claimed_job.claim.attempt or 0, 3)
            written = retry.in_transaction(two, lambda c, r=result: p2.finish_batch(c, [r]))
            if not written.get(claimed_job.id):
                dropped.append(claimed_job.id)
        assert dropped == []
    finally:
        one.dispose()
        two.dispose()
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {database}")
        admin.dispose()
