"""start_bulk()/end_bulk(): multi-row INSERTs, each id mapped to its own job (checklists 16, 17)."""

from __future__ import annotations

import json
import multiprocessing

import pytest

from bgq import Queue


def _params_by_id(installed):
    rows = installed.sql("SELECT id, parameters_json FROM {t}")
    return {
        r["id"]: json.loads(r["parameters_json"])
        if isinstance(r["parameters_json"], str)
        else r["parameters_json"]
        for r in rows
    }


def test_checklist_16_bulk_inserts_in_chunks_and_maps_ids(make_queue, installed, monkeypatch):
    queue = make_queue(bulk_size=3)
    statements = []
    in_transaction, alone = queue.procs.insert_many, queue.procs.insert_many_alone

    def spy(conn, jobs):
        statements.append(len(jobs))
        return in_transaction(conn, jobs)

    def spy_alone(jobs):  # PostgreSQL: a chunk that is the whole flush is one statement of its own
        statements.append(len(jobs))
        return alone(jobs)

    monkeypatch.setattr(queue.procs, "insert_many", spy)
    monkeypatch.setattr(queue.procs, "insert_many_alone", spy_alone)
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
