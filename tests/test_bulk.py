"""start_bulk()/end_bulk(): multi-row INSERTs, each id mapped to its own job (checklists 16, 17)."""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing
import threading

import pytest

from bgq import DatabaseError, OutcomeUnknownError, Queue
from bgq.db import autocommit
from tests.support.helpers import count_rows, utc, wait_until


def _params_by_id(installed):
    rows = installed.sql("SELECT id, parameters_json FROM {t}")
    return {
        r["id"]: json.loads(r["parameters_json"])
        if isinstance(r["parameters_json"], str)
        else r["parameters_json"]
        for r in rows
    }


@pytest.fixture(params=["returning", "no-returning"])
def returning(request, monkeypatch):
    """Run a test twice: as the server allows (PostgreSQL and MariaDB 10.5+: a batch's INSERT
    returns its ids and goes out without waiting), and as on MySQL 8 (no RETURNING: each batch
    is inserted at once, its ids read from the first one's; PostgreSQL: its path for a flush of
    several statements)."""
    if request.param == "returning":
        return lambda queue: queue
    return lambda queue: monkeypatch.setattr(queue.procs.inserts, "returns_many", False) or queue


def test_checklist_16_bulk_inserts_in_chunks_and_maps_ids(make_queue, installed, monkeypatch, returning):
    queue = returning(make_queue(bulk_size=3))
    statements = []
    # A batch that goes out without waiting is built by insert_many_statement (then sent by
    # Procs.send_insert_many); one inserted at once goes through insert_many.
    name = "insert_many_statement" if queue.procs.sends_many else "insert_many"
    original = getattr(queue.procs, name)

    def spy(*args):
        statements.append(len(args[-1]))
        return original(*args)

    monkeypatch.setattr(queue.procs, name, spy)
    queue.start_bulk()
    for n in range(7):
        assert queue.publish("noop", [n]) is None
    assert statements == [3, 3]  # flushed as each chunk filled
    ids = queue.end_bulk()
    assert statements == [3, 3, 1]
    assert len(ids) == 7 and len(set(ids)) == 7
    by_id = _params_by_id(installed)
    assert [by_id[i] for i in ids] == [[n] for n in range(7)]


def test_checklist_17_without_start_bulk_each_publish_inserts_at_once(make_queue, installed):
    queue = make_queue(bulk_size=100)
    job = queue.publish("noop", [1])
    assert isinstance(job, int) and installed.sql("SELECT COUNT(*) AS n FROM {t}")[0]["n"] == 1


def test_bulk_context_manager_and_exception(make_queue, installed):
    queue = make_queue(bulk_size=50)
    with queue.bulk() as batch:
        for n in range(5):
            queue.publish("noop", [n])
    assert len(batch.ids) == 5
    with pytest.raises(RuntimeError), queue.bulk():
        queue.publish("noop", [99])
        raise RuntimeError("abort")
    assert installed.sql("SELECT COUNT(*) AS n FROM {t}")[0]["n"] == 5  # the aborted batch inserted nothing
    assert isinstance(queue.publish("noop"), int)  # and bulk mode ended


def _bulk_publisher(url: str, table: str, tag: str, count: int, out) -> None:
    queue = Queue(
        callbacks={"noop": lambda *a: None},
        database_url=url,
        table_name=table,
        queue="general",
        bulk_size=500,
    )
    with queue.bulk() as batch:
        for n in range(count):
            queue.publish("noop", [tag, n])
    out.put((tag, batch.ids))
    queue.close()


def test_a_bulk_belongs_to_its_thread_on_a_queue_that_threads_share(make_queue, installed):
    """One module-level queue in a threaded web app: a request inside `queue.bulk()` buffers only
    its own jobs. Another thread's publish meanwhile inserts at once and returns its id, and three
    threads bulk-publishing at the same time each get exactly the ids of their own jobs."""
    queue = make_queue(bulk_size=7)
    inside, plain_done = threading.Event(), threading.Event()
    plain = []

    def publish_plainly():
        inside.wait(10)
        plain.append(queue.publish("noop", ["plain"]))
        plain_done.set()

    other = threading.Thread(target=publish_plainly)
    other.start()
    with queue.bulk() as batch:
        queue.publish("noop", ["bulk", 0])
        inside.set()
        assert plain_done.wait(10)
        queue.publish("noop", ["bulk", 1])
    other.join()
    assert isinstance(plain[0], int), plain
    assert plain[0] not in batch.ids and len(batch.ids) == 2
    params = _params_by_id(installed)
    assert params[plain[0]] == ["plain"]
    assert [params[i] for i in batch.ids] == [["bulk", 0], ["bulk", 1]]

    together = threading.Barrier(3)
    got = {}

    def bulk_of(name):
        together.wait(10)
        with queue.bulk() as mine:
            for n in range(50):
                queue.publish("noop", [name, n])
                if n % 10 == 0:
                    together.wait(10)  # keep the three bulks open at the same time
        got[name] = mine.ids

    threads = [threading.Thread(target=bulk_of, args=(name,)) for name in "abc"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    params = _params_by_id(installed)
    for name in "abc":
        assert [params[i] for i in got[name]] == [[name, n] for n in range(50)]
    assert len(params) == 3 + 150


def test_two_concurrent_bulk_publishers_of_10000_jobs_get_their_own_ids(installed):
    """Part A #5: every id maps to its own parameters while another process inserts at the same time."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_bulk_publisher, args=(installed.url, installed.table, tag, 5000, out))
        for tag in "AB"
    ]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    by_id = _params_by_id(installed)
    assert len(by_id) == 10_000
    for tag, ids in results.items():
        assert [by_id[i] for i in ids] == [[tag, n] for n in range(5000)]


# --- every column of a bulk row is what publish() alone would store (PostgreSQL: arrays as text) ---

TRICKY_TEXT = [
    'quote " and backslash \\ and braces {a,b} and NULL',
    "NULL",
    "null",
    "line\nbreak\ttab\rreturn\x1funit",
    "ünïcødé 日本 🎉",
    '{"json": [1, "x"]}',
    ",",
    "\\x00ff",
]


def _publish_tricky(queue: Queue) -> None:
    for n, text in enumerate(TRICKY_TEXT):
        queue.publish("noop", [text, n], serial_group=f"g {text}"[:255].rstrip())
        queue.publish("noop", {"k": text}, identifier=text.strip() or "x", mode="unique")
    queue.publish("noop")  # no parameters
    queue.publish("noop", [], priority=2, postpone_by=1234)
    queue.publish("noop", ["big"], serial_group="g", coalesce_threshold=2**40)
    queue.publish("noop", [{1, 2}, b"\x00\\\x01{}"])  # not JSON: pickled (bytea / BLOB)
    queue.publish("other", ["sub-queue"])
    queue.publish("tab\tname", ["a callback name with a control character"])


@pytest.mark.parametrize("clocked", [False, True], ids=["server-clock", "option-clock"])
def test_bulk_rows_are_the_rows_publish_stores_one_by_one(make_queue, installed, clocked):
    from tests.support.clock import Clock

    options: dict = {
        "callbacks": {
            "noop": lambda *a, **k: None,
            "other": {"callback": lambda *a: None, "queue": "sub"},
            "tab\tname": lambda *a: None,
        },
        "priorities": [1, 2],
        "allow_pickle": True,
    }
    if clocked:
        options["clock"] = Clock()
    one_by_one = make_queue(**options)
    _publish_tricky(one_by_one)
    single = installed.sql("SELECT * FROM {t} ORDER BY id")
    bulk = make_queue(bulk_size=1000, **options)
    with bulk.bulk() as batch:
        _publish_tricky(bulk)
    rows = {r["id"]: r for r in installed.sql("SELECT * FROM {t} ORDER BY id")}
    assert len(batch.ids) == len(single) and sorted(batch.ids) == batch.ids
    assert rows.keys() == {r["id"] for r in single} | set(batch.ids)
    varying = {"id", "created_at", "updated_at"}
    for alone, job_id in zip(single, batch.ids, strict=True):
        assert {k: v for k, v in rows[job_id].items() if k not in varying} == {
            k: v for k, v in alone.items() if k not in varying
        }
        if clocked:  # the option's time, to the microsecond, as publish() stores it
            assert utc(rows[job_id]["created_at"]) == utc(alone["created_at"]) == options["clock"]()
            assert rows[job_id]["updated_at"] == alone["updated_at"]


def test_a_bulk_larger_than_one_statement_is_inserted_in_one_transaction(make_queue, installed, monkeypatch):
    """Parameters over BULK_INSERT_BYTES go in several statements of one transaction: ids still
    map to their jobs, and a failure in a later statement leaves none of them."""
    from bgq.jobs import publisher

    monkeypatch.setattr(publisher, "BULK_INSERT_BYTES", 40)
    queue = make_queue(bulk_size=100)
    with queue.bulk() as batch:
        for n in range(10):
            queue.publish("noop", [f"job-{n:02d}"])  # ["job-00"]: 10 bytes, 4 per statement
    by_id = _params_by_id(installed)
    assert [by_id[i] for i in batch.ids] == [[f"job-{n:02d}"] for n in range(10)]

    statements = []
    original = queue.procs.insert_many

    def fail_third(conn, jobs):
        statements.append(len(jobs))
        if len(statements) == 3:
            raise RuntimeError("the third statement fails")
        return original(conn, jobs)

    monkeypatch.setattr(queue.procs, "insert_many", fail_third)
    with pytest.raises(RuntimeError), queue.bulk():
        for n in range(10):
            queue.publish("noop", [f"new-{n:02d}"])
    assert statements == [4, 4, 2]
    assert len(_params_by_id(installed)) == 10  # the first two statements were rolled back


def _many_bulk_publisher(url: str, table: str, tag: str, go, out) -> None:
    queue = Queue(
        callbacks={"noop": lambda *a: None},
        database_url=url,
        table_name=table,
        queue="general",
        priorities=[1, 2, 3],
        bulk_size=50,
    )
    queue.publish("noop", [tag, -1])  # connected and checked before the start
    go.wait(60)
    with queue.bulk() as batch:
        for n in range(1500):
            queue.publish("noop", [tag, n], priority=1 + n % 3, serial_group=f"g{n % 7}" if n % 2 else None)
    out.put((tag, batch.ids))
    queue.close()


def test_four_processes_bulk_publishing_at_once_each_get_the_ids_of_their_own_jobs(installed):
    """Small batches (50) from four processes started together: their statements interleave, and
    each returned id is the row of that process's job, in its order."""
    ctx = multiprocessing.get_context("spawn")
    out, go = ctx.Queue(), ctx.Barrier(4)
    procs = [
        ctx.Process(target=_many_bulk_publisher, args=(installed.url, installed.table, tag, go, out))
        for tag in "ABCD"
    ]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=180) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rows = installed.sql("SELECT id, parameters_json, priority, serial_group FROM {t}")
    by_id = {r["id"]: r for r in rows}
    assert len(by_id) == 4 * 1501
    for tag, ids in results.items():
        assert len(ids) == 1500 and ids == sorted(ids)
        for n, job_id in enumerate(ids):
            row = by_id[job_id]
            params = (
                json.loads(row["parameters_json"])
                if isinstance(row["parameters_json"], str)
                else row["parameters_json"]
            )
            assert params == [tag, n]
            assert row["priority"] == 1 + n % 3 and row["serial_group"] == (f"g{n % 7}" if n % 2 else None)
    all_ids = [i for ids in results.values() for i in ids]
    assert len(set(all_ids)) == len(all_ids)


# --- PostgreSQL sends a batch and reads its ids at the next flush: what a caller sees of that ---


def test_a_full_batch_is_committed_without_waiting_for_the_next_publish(make_queue, installed):
    """The server commits a batch as soon as it has inserted it: jobs published in bulk reach
    the workers while the publisher is busy elsewhere, whatever it does next."""
    queue = make_queue(bulk_size=3)
    with queue.bulk() as batch:
        for n in range(4):
            queue.publish("noop", [n])
        wait_until(lambda: count_rows(installed) == 3, "the first batch committed")
    assert [_params_by_id(installed)[i] for i in batch.ids] == [[n] for n in range(4)]


@pytest.fixture
def refusing(installed, dialect):
    """The test table refuses (a trigger raises) every row whose parameters hold "boom"."""
    t = installed.table
    if dialect == "postgres":
        installed.sql(
            f"CREATE FUNCTION {t}_boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            " IF NEW.parameters_json::text LIKE '%%boom%%' THEN RAISE EXCEPTION 'boom refused'"
            " USING ERRCODE = '22023'; END IF; RETURN NEW; END $$"
        )
        installed.sql(
            f"CREATE TRIGGER {t}_boom BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION {t}_boom()"
        )
    else:
        installed.sql(
            f"CREATE TRIGGER {t}_boom BEFORE INSERT ON {t} FOR EACH ROW"
            " IF NEW.parameters_json LIKE '%%boom%%' THEN"
            " SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'boom refused'; END IF"
        )
    try:
        yield
    finally:
        installed.sql(f"DROP TRIGGER {t}_boom" + (f" ON {t}" if dialect == "postgres" else ""))
        if dialect == "postgres":
            installed.sql(f"DROP FUNCTION {t}_boom()")


def test_a_refused_batch_raises_ends_the_bulk_and_keeps_the_ids_of_the_jobs_before_it(
    make_queue, installed, refusing, returning
):
    """Batches of 3: the second holds a job the database refuses. Its error reaches the caller
    from the publish that fills the batch after it (a batch that goes out without waiting) or
    the one that fills it (MySQL 8), the bulk ends, and batch.ids are the ids of the jobs
    published first, in order; none of the jobs after them is in the table, and the connection
    serves the next publish."""
    queue = returning(make_queue(bulk_size=3))
    raised_at = None
    with pytest.raises(DatabaseError, match="boom refused") as raised, queue.bulk() as batch:
        for n in range(12):
            raised_at = n
            queue.publish("noop", ["boom" if n == 4 else "fine", n])
    assert raised_at == (8 if queue.procs.sends_many else 5)
    assert not isinstance(raised.value, OutcomeUnknownError)  # refused: certainly not inserted
    by_id = _params_by_id(installed)
    assert [by_id[i] for i in batch.ids] == [["fine", n] for n in range(3)]
    assert len(by_id) == 3
    after = queue.publish("noop", ["after"])  # the bulk is over: inserted at once
    assert isinstance(after, int) and queue.end_bulk() == []
    assert count_rows(installed) == 4


def test_end_bulk_raises_the_error_of_the_last_batch(make_queue, installed, refusing):
    queue = make_queue(bulk_size=3)
    queue.start_bulk()
    for n in range(3):
        queue.publish("noop", ["fine", n])
    queue.publish("noop", ["boom"])
    with pytest.raises(DatabaseError, match="boom refused"):
        queue.end_bulk()
    assert sorted(v for v in _params_by_id(installed).values()) == [["fine", n] for n in range(3)]
    assert isinstance(queue.publish("noop", ["after"]), int)


def test_an_exception_inside_a_bulk_keeps_the_batch_already_sent(make_queue, installed):
    """The caller's exception drops the jobs buffered; a batch already handed to the database is
    in, and its ids are in batch.ids; the connection is back for the next publish."""
    queue = make_queue(bulk_size=3)
    with pytest.raises(RuntimeError), queue.bulk() as batch:
        for n in range(4):
            queue.publish("noop", [n])
        raise RuntimeError("abort")
    by_id = _params_by_id(installed)
    assert [by_id[i] for i in batch.ids] == [[n] for n in range(3)] and len(by_id) == 3
    assert isinstance(queue.publish("noop", ["after"]), int)
    assert len(queue.store.database.alone._free) == 1  # one connection served both


def test_a_sent_batch_that_fails_during_the_callers_exception_is_logged(
    make_queue, installed, refusing, caplog
):
    """The caller's exception goes on; the failure of the batch it interrupted is logged."""
    queue = make_queue(bulk_size=3)
    with (
        caplog.at_level(logging.ERROR, logger="bgq"),
        pytest.raises(RuntimeError, match="abort"),
        queue.bulk() as batch,
    ):
        for n in range(3):
            queue.publish("noop", ["boom", n])
        raise RuntimeError("abort")
    assert "interrupted bulk failed" in caplog.text and "boom refused" in caplog.text
    assert batch.ids == [] and count_rows(installed) == 0
    assert isinstance(queue.publish("noop", ["after"]), int)


def test_threads_that_end_inside_a_bulk_leave_no_connection_behind(make_queue, installed, monkeypatch):
    """A bulk never ended (its thread returned after a batch was sent): the connection it held
    is closed when the bulk is garbage, so publish's connection slots do not run out."""
    monkeypatch.setattr(autocommit, "WAIT_S", 2.0)
    queue = make_queue(bulk_size=2)
    slots = queue.store.database.alone.in_use

    def abandon(n: int) -> None:
        queue.start_bulk()
        queue.publish("noop", [n, 0])
        queue.publish("noop", [n, 1])  # a full batch: sent (PostgreSQL) or inserted (MySQL)

    for n in range(slots + 2):
        thread = threading.Thread(target=abandon, args=(n,))
        thread.start()
        thread.join()
        gc.collect()
    assert isinstance(queue.publish("noop", ["after"]), int)  # a slot was free at once
    wait_until(lambda: count_rows(installed) == 2 * (slots + 2) + 1, "every sent batch committed")


def _child_end_bulk(queue: Queue, out) -> None:
    try:
        queue.end_bulk()
        out.put("no error")
    except DatabaseError as exc:
        out.put(str(exc))


def test_a_batch_sent_before_a_fork_is_read_by_the_parent_only(make_queue, installed):
    """A forked child must not read the reply meant for its parent's connection."""
    queue = make_queue(bulk_size=3)
    queue.start_bulk()
    for n in range(3):
        queue.publish("noop", [n])
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_end_bulk, args=(queue, out))
    child.start()
    message = out.get(timeout=60)
    child.join(60)
    assert "before a fork" in message
    ids = queue.end_bulk()
    by_id = _params_by_id(installed)
    assert [by_id[i] for i in ids] == [[n] for n in range(3)] and len(by_id) == 3


def test_an_empty_bulk_does_not_touch_the_database():
    """Nothing published, nothing to insert or read: ending the bulk needs no connection."""
    queue = Queue(callbacks={"noop": lambda: None}, database_url="postgresql://nobody@127.0.0.1:9/none")
    with queue.bulk() as batch:
        pass
    queue.start_bulk()
    assert queue.end_bulk() == [] and batch.ids == []
    assert not queue.store.opened
