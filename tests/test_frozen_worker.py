"""A frozen bgq session holds up the other workers for a bounded time only (DESIGN invariant 7).

Real `bgq work` processes run several serial groups of short ledger jobs (tests/support/work_app.py);
their 'end' events, with each worker's own clock reading, show when work got done. A session
frozen inside a bgq transaction (a test session that ran the hand-off and never commits, or a
worker SIGSTOPped at a random instant) must stall the other groups for at most the documented
bound (`lock_timeout`, 5 s by default, plus the retry pause), and a frozen session is cut by the
server, after which its owner's next transaction runs on a new connection and stays fenced.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import random
import signal
import time
from collections import Counter
from typing import Any

import pytest

from bgq import JobState
from bgq.db import Database
from bgq.errors import BgqError
from bgq.model import JobResult
from bgq.sql.calls import Procs
from tests.support import work_app
from tests.support.helpers import session_id, wait_session_gone, wait_until
from tests.test_work import cli  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow

#: What the README promises with the default lock_timeout (5 s): nobody waits longer than this.
BOUND = 10.0
GROUPS = 6
JOB_SECONDS = 0.02
PID = 4242


def _publish(make_queue, specs: list[tuple[str, str | None, int]]) -> dict[str, dict[str, Any]]:
    """Insert every job in one statement; token -> {id, group, priority}."""
    queue = make_queue(callbacks={"ledger": work_app.ledger}, priorities=[1, 2, 3], bulk_size=len(specs))
    with queue.bulk() as batch:
        for token, group, priority in specs:
            queue.publish("ledger", [token, group, JOB_SECONDS], serial_group=group, priority=priority)
    return {
        token: {"id": job_id, "group": group, "priority": priority}
        for (token, group, priority), job_id in zip(specs, batch.ids, strict=True)
    }


def _backlog(per_group: int, seed: int, ungrouped: int = 0) -> list[tuple[str, str | None, int]]:
    rng = random.Random(seed)
    specs = [(f"g{g}-{n}", f"g{g}", rng.choice([1, 2, 3])) for g in range(GROUPS) for n in range(per_group)]
    specs += [(f"u{n}", None, rng.choice([1, 2, 3])) for n in range(ungrouped)]
    rng.shuffle(specs)
    return specs


def _longest_gap(
    events: list[dict[str, Any]], start: float, end: float, pids: set[int] | None = None
) -> float:
    """The longest stretch of [start, end] in which no job ended (of `pids`, if given)."""
    ends = sorted(
        e["at"]
        for e in events
        if e["event"] == "end" and start <= e["at"] <= end and (pids is None or e["pid"] in pids)
    )
    marks = [start, *ends, end]
    return max(b - a for a, b in zip(marks, marks[1:], strict=False))


def _ends(runner) -> int:
    return sum(e["event"] == "end" for e in runner.events())


def test_a_session_frozen_in_the_hand_off_stalls_others_within_the_bound(make_queue, installed, cli, dialect):  # noqa: F811
    """A session of bgq's own Database claims the head of group 'gf' (committed, as a worker's
    claim), then runs the hand-off ({table}_hand_off: the result, and the group's
    next head) and stays idle inside that transaction for 12 s, exactly as a worker frozen there.
    Three `bgq work` processes working six other groups keep finishing jobs: no stretch of more
    than BOUND seconds without a finished job. The server cuts the frozen session (its next
    statement fails), the same Database's next transaction gets a new connection, and the
    zombie's result is fenced once its job was reaped and claimed again."""
    hold = 12.0
    frozen = _publish(make_queue, [(f"gf-{n}", "gf", 1) for n in range(3)])
    holder = Database(installed.url)
    procs = Procs(holder, installed.table)
    try:
        with holder.transaction() as conn:
            _, (head,) = procs.hand_off(conn, [], ["gf"], "general", PID, None, None, 1000)
        assert head.id == frozen["gf-0"]["id"]

        runner = cli()
        workers = [runner.start("work") for _ in range(3)]
        runner.wait_ready(3)
        _publish(make_queue, _backlog(per_group=400, seed=3))
        wait_until(lambda: _ends(runner) >= 50, "the workers to be busy", 60, step=0.1)

        conn = holder.engine.connect()
        conn.begin()
        written, successor = procs.hand_off(
            conn, [JobResult(head.id, head.claim.attempt or 0, int(JobState.FINISHED))],
            ["gf"], "general", PID, None, None, 1000,
        )  # fmt: skip
        assert written == {head.id: True} and [j.id for j in successor] == [frozen["gf-1"]["id"]]
        held_at = time.time()
        time.sleep(hold)  # real: a session frozen idle in its transaction for longer than BOUND
        try:
            conn.exec_driver_sql("SELECT 1").all()
            cut = False
        except Exception:
            cut = True
        finally:
            conn.close()
        released_at = time.time()

        wait_until(lambda: _ends(runner) >= 50, "ledger", 5)  # the ledger is readable
        events = runner.events()
        gap = _longest_gap(events, held_at, released_at)
        done = sum(1 for e in events if e["event"] == "end" and held_at <= e["at"] <= released_at)
        print(f"\n{dialect}: {done} jobs finished in the {hold:.0f} s hold; longest stall {gap:.2f} s")
        for proc in workers:
            code, _ = runner.terminate(proc, timeout=30)
            assert code == 0, runner.output(proc)
        assert gap <= BOUND, f"the other groups stalled for {gap:.1f} s behind one frozen session"
        assert cut, "the server did not cut the session frozen inside its transaction"

        # The zombie comes back: its transaction was rolled back (gf-0 is still PROCESSING under
        # its claim). Once the job is reaped and claimed by someone else, its late result is fenced.
        state = installed.sql("SELECT state FROM {t} WHERE id = %s", (head.id,))[0]["state"]
        assert state == JobState.PROCESSING
        with holder.transaction() as again:
            reaped = procs.reap(again, "general", 1, 10, dt.datetime.now(dt.UTC) + dt.timedelta(hours=2))
        assert [r.id for r in reaped] == [head.id]
        installed.sql("UPDATE {t} SET postponed_by = 0 WHERE id = %s", (head.id,))
        with holder.transaction() as again:
            _, (taken,) = procs.hand_off(again, [], ["gf"], "general", PID + 1, None, None, 1000)
        assert taken.id == head.id and taken.claim.attempt == (head.claim.attempt or 0) + 1
        with holder.transaction() as again:
            late = procs.finish_batch(again, [JobResult(head.id, head.claim.attempt or 0, 3)])
        assert late == {head.id: False}, "the zombie's late result overwrote the new owner's claim"
    finally:
        holder.dispose()


def test_sigstopped_workers_hold_up_the_others_only_within_the_bound(make_queue, installed, cli, dialect):  # noqa: F811
    """Three `bgq work` processes on six groups and ungrouped jobs; twice, one of them
    (chosen at random, at a random instant: in a callback, a claim, a hand-off or a batch
    write) is SIGSTOPped for longer than BOUND and then continued. The other two never go more
    than BOUND seconds without finishing a job; the frozen one works again after SIGCONT (its
    cut session replaced); no job ran twice and no group overlapped or ran out of order."""
    freeze = BOUND + 2.0  # longer than the bound: others blocked for the whole freeze would fail
    rng = random.Random(int(time.time()))
    runner = cli()
    workers = {p.pid: p for p in (runner.start("work") for _ in range(3))}
    runner.wait_ready(3)
    jobs = _publish(make_queue, _backlog(per_group=500, seed=7, ungrouped=300))
    wait_until(lambda: _ends(runner) >= 50, "the workers to be busy", 60, step=0.1)
    figures = []
    for _ in range(2):
        at = _ends(runner) + rng.randint(5, 60)  # a random instant: after some more jobs ended
        wait_until(lambda at=at: _ends(runner) >= at, "more jobs to end", 60, 0.02)
        victim = rng.choice(sorted(workers))
        os.kill(victim, signal.SIGSTOP)
        stopped_at = time.time()
        time.sleep(freeze)  # real: a process stopped for longer than BOUND while the others work
        resumed_at = time.time()
        os.kill(victim, signal.SIGCONT)
        # The frozen worker finishes jobs again (its next transactions run on a new connection).
        wait_until(
            lambda v=victim, t=resumed_at: any(
                e["event"] == "end" and e["pid"] == v and e["at"] > t for e in runner.events()
            ),
            f"worker {victim} to work again after SIGCONT",
            30,
            step=0.2,
        )
        others = set(workers) - {victim}
        gap = _longest_gap(runner.events(), stopped_at, resumed_at, others)
        figures.append(round(gap, 2))
    print(f"\n{dialect}: longest stall of the other workers per freeze: {figures} s")
    for proc in workers.values():
        code, _ = runner.terminate(proc, timeout=30)
        assert code == 0, runner.output(proc)
    assert max(figures) <= BOUND, f"a frozen worker stalled the others: {figures} s"

    events = [e for e in runner.events() if e["event"] in ("start", "end")]
    starts = Counter(e["token"] for e in events if e["event"] == "start")
    ends = Counter(e["token"] for e in events if e["event"] == "end")
    assert max(starts.values()) == 1 and starts == ends, "a job ran twice, or did not end"
    finished = {t for t in ends}
    grouped = {t: j for t, j in jobs.items() if t in finished and j["group"] is not None}
    by_group = Counter(j["group"] for j in grouped.values())
    assert by_group, "no grouped job ran"
    # Each group ran a (priority, id) prefix of its jobs, one at a time.
    for group in by_group:
        mine = sorted(
            (t for t, j in jobs.items() if j["group"] == group),
            key=lambda t: (jobs[t]["priority"], jobs[t]["id"]),
        )
        seq = [(e["token"], e["event"]) for e in events if e["grp"] == group]
        ran = [token for token, event in seq if event == "start"]
        assert ran == mine[: len(ran)], f"group {group} ran out of order"
        assert seq == [(t, ev) for t in ran for ev in ("start", "end")], f"jobs of {group} overlapped"


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pooled"])
def test_a_session_cut_for_idling_in_a_transaction_is_replaced_at_the_next_transaction(installed, pinned):
    """bgq work's pinned connection and a pooled one alike: the server ends a session idle in a
    transaction for lock_timeout; the statement after the pause fails with a BgqError (the
    transaction is gone with its locks), and the next transaction runs on a new session."""
    db = Database(installed.url, lock_timeout=1)
    try:
        with db.pinned() if pinned else contextlib.nullcontext():
            with db.transaction() as conn:
                first = session_id(conn)
                conn.exec_driver_sql(f"SELECT id FROM {installed.table} FOR UPDATE").all()
            with pytest.raises(BgqError), db.transaction() as conn:
                conn.exec_driver_sql(f"SELECT id FROM {installed.table} FOR UPDATE").all()
                # frozen inside the transaction until the server cuts it (idle for lock_timeout)
                wait_session_gone(installed, session_id(conn))
                conn.exec_driver_sql("SELECT 1").all()
            with db.transaction() as conn:
                assert conn.exec_driver_sql("SELECT 1").scalar() == 1
                assert session_id(conn) != first or not pinned
    finally:
        db.dispose()
