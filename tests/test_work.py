"""`bgq work`, the continuous database worker, end to end on both dialects.

In-process: `bgq.modes.work.work(queue, stop=...)` runs in a thread and stops when the test sets
`stop.requested`. As a person runs it: `bgq --app tests.support.work_app:queue work` in a subprocess.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import threading
import time
from collections import Counter
from typing import Any

import pytest

import bgq.jobs.callback
import bgq.jobs.executor
import bgq.jobs.heartbeat
import bgq.modes.pipeline
import bgq.modes.work
from bgq import (
    DieException,
    JobState,
    PermanentErrorException,
    SkipException,
    TemporaryErrorException,
    WaitingException,
)
from bgq.errors import ConfigError
from bgq.modes.work import work
from tests.support import ledger_worker, work_app
from tests.support.clock import FakeTime, fake_time
from tests.support.helpers import (
    fail_first_follow_up,
    json_column,
    slow_write,
    state_of,
    unique_name,
    wait_until,
)
from tests.support.work_app import Cli

MINUTE = 60_000
TERMINAL = (JobState.FINISHED, JobState.PERMANENTLY_FAILED, JobState.REDUNDANT)


# --- helpers ---


class Stop:
    """What work() looks at between two jobs: `requested` (a GracefulStop without signals)."""

    def __init__(self) -> None:
        self.requested = False


class Worker(threading.Thread):
    """work(queue, stop=...) on a thread of the test process."""

    def __init__(self, queue: Any, name: str = "worker", **options: Any) -> None:
        super().__init__(name=name, daemon=True)
        options.setdefault("poll", 0.2)  # an idle worker sees the stop request soon
        self.queue, self.options = queue, options
        self.stop = Stop()
        self.code: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.code = work(self.queue, stop=self.stop, **self.options)  # type: ignore[arg-type]
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def finish(self, timeout: float = 10.0) -> int | None:
        """Request the stop and wait for work() to return; its return value."""
        self.stop.requested = True
        return self.returned(timeout)

    def returned(self, timeout: float) -> int | None:
        self.join(timeout)
        assert not self.is_alive(), f"work() did not return within {timeout} s"
        if self.error is not None:
            raise self.error
        return self.code


@pytest.fixture
def workers():
    """Start in-process workers: workers(queue, name=..., **options); all are stopped at teardown."""
    started: list[Worker] = []

    def start(queue: Any, name: str = "worker", *, run: bool = True, **options: Any) -> Worker:
        worker = Worker(queue, name, **options)
        started.append(worker)
        if run:
            worker.start()
        return worker

    yield start
    for worker in started:
        worker.stop.requested = True
    for worker in started:
        worker.join(30)


@pytest.fixture
def cli(installed, tmp_path, monkeypatch):
    """`bgq work` subprocesses on the installed table, with a ledger; factory cli(stalled=None)."""
    made: list[Cli] = []
    ledger = unique_name("wledger")
    ledger_worker.create_ledger(installed.url, ledger)
    monkeypatch.setenv("BGQ_TEST_WORK_URL", installed.url)
    monkeypatch.setenv("BGQ_TEST_WORK_LEDGER", ledger)

    def factory(stalled: int | None = None) -> Cli:
        made.append(Cli(installed.url, installed.table, ledger, tmp_path, stalled))
        return made[-1]

    yield factory
    for runner in made:
        runner.close()
    work_app.dispose()
    ledger_worker.drop_ledger(installed.url, ledger)


def _rows(installed) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in installed.sql("SELECT * FROM {t} ORDER BY id")}


def _row(installed, job_id: int) -> dict[str, Any]:
    return installed.sql("SELECT * FROM {t} WHERE id = %s", (job_id,))[0]


def _states(installed, ids) -> list[int]:
    rows = _rows(installed)
    return [rows[i]["state"] for i in ids]


def _all_in(installed, ids, states) -> bool:
    return all(s in states for s in _states(installed, ids))


def _processing(installed) -> list[int]:
    return [r["id"] for r in installed.sql("SELECT id FROM {t} WHERE state = 2")]


def _held(installed, ids: dict[str, int], called) -> list[int]:
    """Jobs claimed (PROCESSING) that have not started: a run job may still wait for the writer."""
    ran = {ids[token] for token in called}
    return [i for i in _processing(installed) if i not in ran]


def _assert_given_back(row: dict[str, Any]) -> None:
    """A job claimed ahead but never started, given back: READY, its attempt restored, no owner."""
    assert row["state"] == JobState.READY, row
    assert row["number_of_attempts"] == 0, row
    assert row["pid"] is None, row


# --- every job once; the outcomes of process_job ---


def test_every_job_runs_once_and_ends_finished(make_queue, installed, workers):
    calls: Counter[str] = Counter()
    queue = make_queue(callbacks={"rec": lambda token: calls.update([token])}, priorities=[1, 2, 3])
    rng = random.Random(1)
    ids = {}
    for n in range(45):
        group = f"g{n % 3}" if n < 15 else None
        ids[f"t{n}"] = queue.publish("rec", [f"t{n}"], serial_group=group, priority=rng.choice([1, 2, 3]))
    worker = workers(queue)
    wait_until(lambda: _all_in(installed, ids.values(), TERMINAL), "every job to end", 15)
    assert worker.finish() == 0
    assert calls == Counter(ids.keys()), "every job ran exactly once"
    for row in _rows(installed).values():
        assert row["state"] == JobState.FINISHED, row
        assert row["number_of_attempts"] == 1 and row["pid"] == os.getpid(), row
        assert row["finished_at"] is not None and row["error_message"] is None, row


@pytest.mark.parametrize(
    ("grouped", "heads"),
    [(False, bgq.modes.work.HEADS_MAX), (True, 1), (True, bgq.modes.work.HEADS_MAX)],
    ids=["ungrouped", "grouped-chain", "grouped-batch"],
)
def test_outcomes_as_in_process_job(make_queue, installed, workers, caplog, grouped, heads, monkeypatch):
    """The written results of ungrouped jobs, of a lone group's chain (one head at a time, handed
    on by the main thread) and of several groups kept together (their results written and their
    next heads claimed by the writer), each result written once, by hand_off, the one write path
    of `bgq work` (RECURRING and WaitingException included)."""
    monkeypatch.setattr(bgq.modes.work, "HEADS_MAX", heads)
    if grouped and heads > 1:  # every claim takes several heads from the first (not 1: a slow start)
        monkeypatch.setattr(bgq.modes.work._Worker, "_size", lambda self: bgq.modes.work.BATCH_MAX)
    calls: Counter[str] = Counter()

    def raising(name: str, exc: Exception | None):
        def callback(*args: Any) -> None:
            calls.update([name])
            if exc is not None:
                raise exc

        return callback

    callbacks = {
        "temp": raising("temp", TemporaryErrorException("later")),
        "runtime": raising("runtime", RuntimeError("smtp down")),
        "perm": raising("perm", PermanentErrorException("bad address")),
        "skip": raising("skip", SkipException("nothing to do")),
        "wait": raising("wait", WaitingException("not yet")),
        "recur": raising("recur", None),
        "uniq": raising("uniq", None),
        "ok": raising("ok", None),
        "last": raising("last", None),
    }
    options = {"priorities": [1, 2, 3], "waiting_job_expiration": 600_000}  # clones are not due
    publisher = make_queue(callbacks={**callbacks, "gone": lambda: None}, **options)
    queue = make_queue(callbacks=callbacks, **options)

    def publish(name: str, callback: str | None = None, **kw: Any) -> int:
        group = f"g-{name}" if grouped else None
        return publisher.publish(callback or name, [name], serial_group=group, **kw)

    ids = {name: publish(name) for name in ("temp", "runtime", "perm", "skip", "wait", "ok")}
    ids["recur"] = publish("recur", mode="recurring", identifier="r1")
    ids["uniq1"] = publish("uniq", "uniq", mode="unique", identifier="u1")
    ids["uniq2"] = publish("uniq", "uniq", mode="unique", identifier="u1")
    ids["gone"] = publish("gone")
    originals = set(ids.values())
    ended = (*TERMINAL, JobState.TEMPORARILY_FAILED)

    def done() -> bool:
        rows = _rows(installed)
        recurring = [r for r in rows.values() if r["callback_name"] == "recur"]
        others = [rows[i]["state"] in ended for i in originals if i != ids["recur"]]
        return (
            all(others) and [r["state"] for r in recurring] == [JobState.READY] and ids["recur"] not in rows
        )

    # Which procedure wrote each result: one write path, `finish` never (clones included).
    writes: list[tuple[str, int]] = []

    def recording(name: str, real: Any) -> Any:
        def call(conn: Any, results: Any, *args: Any, **kwargs: Any) -> Any:
            writes.extend((name, r.id) for r in results if r.state != JobState.READY)
            return real(conn, results, *args, **kwargs)

        return call

    monkeypatch.setattr(queue.procs, "finish_batch", recording("finish_batch", queue.procs.finish_batch))
    monkeypatch.setattr(queue.procs, "hand_off", recording("hand_off", queue.procs.hand_off))
    monkeypatch.setattr(queue.procs, "finish", recording("finish", queue.procs.finish))

    with caplog.at_level(logging.CRITICAL, logger="bgq"):
        worker = workers(queue)
        wait_until(done, "every job to end", 15)
        # A later job, run and written: the claim that took it would have taken a clone run by
        # mistake too (the clone has a lower id and the same priority), which would show in `calls`.
        last = publisher.publish("last", ["last"])
        wait_until(lambda: state_of(installed, last) == JobState.FINISHED, "the later job to be written", 15)
        assert worker.finish() == 0

    written = {ids[n] for n in ("temp", "runtime", "perm", "skip", "wait", "recur", "ok", "uniq1", "gone")}
    assert sorted(writes) == sorted(("hand_off", i) for i in written | {last})
    rows = _rows(installed)
    assert calls == Counter(
        {"temp": 1, "runtime": 1, "perm": 1, "skip": 1, "wait": 1, "recur": 1, "uniq": 1, "ok": 1, "last": 1}
    )
    assert not _processing(installed)

    temp, runtime = rows[ids["temp"]], rows[ids["runtime"]]
    assert (temp["state"], temp["error_message"], temp["postponed_by"]) == (4, "later", MINUTE)
    assert (runtime["state"], runtime["postponed_by"]) == (4, MINUTE)
    assert runtime["error_message"] == "RuntimeError: smtp down"

    perm = rows[ids["perm"]]
    assert (perm["state"], perm["error_message"]) == (JobState.PERMANENTLY_FAILED, "bad address")
    message = f"bgq: Permanent error occurred. (ID: {ids['perm']})"
    (record,) = [r for r in caplog.records if r.getMessage() == message]
    assert record.levelno == logging.CRITICAL
    assert isinstance(record.exc_info[1], PermanentErrorException)

    assert (rows[ids["skip"]]["state"], rows[ids["skip"]]["error_message"]) == (3, "nothing to do")
    assert rows[ids["ok"]]["state"] == JobState.FINISHED

    wait = rows[ids["wait"]]
    assert (wait["state"], wait["error_message"]) == (JobState.FINISHED, "not yet")
    (clone,) = [r for i, r in rows.items() if i not in originals and r["callback_name"] == "wait"]
    assert clone["state"] == JobState.READY and clone["number_of_attempts"] == 0
    assert clone["serial_group"] == wait["serial_group"] and json_column(clone["parameters_json"]) == ["wait"]

    assert ids["recur"] not in rows, "a finished RECURRING job's row is replaced by its successor"
    (successor,) = [r for i, r in rows.items() if i not in originals and r["callback_name"] == "recur"]
    assert successor["id"] > ids["recur"] and successor["state"] == JobState.READY
    assert (successor["mode"], successor["identifier"]) == ("recurring", "r1")

    assert rows[ids["uniq1"]]["state"] == JobState.FINISHED
    assert rows[ids["uniq2"]]["state"] == JobState.REDUNDANT

    gone = rows[ids["gone"]]
    assert gone["state"] == JobState.PERMANENTLY_FAILED
    assert gone["error_message"] == 'Callback "gone" does not exist.'
    assert any(
        f'Callback "gone" does not exist. (ID: {ids["gone"]})' in r.getMessage() for r in caplog.records
    )
    assert len(rows) == len(originals) + 2  # the two copies, less the finished recurring row, and last


def test_hooks_metadata_execution_time_and_memory(make_queue, installed, workers, monkeypatch):
    seen: dict[str, list[Any]] = {"before": [], "after": [], "error": []}
    fake = FakeTime()  # the clock of the execution time
    monkeypatch.setattr(bgq.jobs.callback, "time", fake)

    def slow(n: int, fail: bool = False) -> None:
        fake.advance(0.03)  # a callback that takes 30 ms
        if fail:
            raise RuntimeError(f"failed {n}")

    queue = make_queue(
        callbacks={"slow": slow},
        on_before_process=lambda p: seen["before"].append(p["n"]),
        on_after_process=lambda p: seen["after"].append(p["n"]),
        on_error=lambda exc, p: seen["error"].append((p["n"], str(exc))),
        on_processing_get_metadata=lambda p: {"host": "h1", "n": p["n"]},
    )
    ok = [queue.publish("slow", {"n": 1}), queue.publish("slow", {"n": 2}, serial_group="g")]
    failing = [
        queue.publish("slow", {"n": 3, "fail": True}),
        queue.publish("slow", {"n": 4, "fail": True}, serial_group="h"),
    ]
    worker = workers(queue)
    wait_until(
        lambda: _all_in(installed, ok + failing, (JobState.FINISHED, JobState.TEMPORARILY_FAILED)),
        "the jobs to end",
        15,
    )
    assert worker.finish() == 0
    assert sorted(seen["before"]) == [1, 2, 3, 4]
    assert sorted(seen["after"]) == [1, 2]
    assert sorted(seen["error"]) == [(3, "failed 3"), (4, "failed 4")]
    rows = _rows(installed)
    for n, job in enumerate(ok + failing, start=1):
        assert json_column(rows[job]["metadata"]) == {"host": "h1", "n": n}, rows[job]
    for job in ok:
        row = rows[job]
        assert row["state"] == JobState.FINISHED
        assert 25 <= row["execution_time"] < 5000, row
        memory = json_column(row["memory"])
        assert set(memory) == {"before", "after"} and memory["after"]["rss"] > 0, row
    for job in failing:
        assert rows[job]["state"] == JobState.TEMPORARILY_FAILED


# --- serial groups ---


def test_grouped_jobs_run_in_priority_order_without_overlap(make_queue, installed, workers):
    """Two in-process workers; every run's (start, end) on one monotonic clock."""
    lock = threading.Lock()
    runs: list[tuple[str, str | None, float, float]] = []

    def rec(token: str, group: str | None) -> None:
        start = time.monotonic()
        time.sleep(random.uniform(0.001, 0.006))  # real: a run time the other worker's jobs may overlap
        with lock:
            runs.append((token, group, start, time.monotonic()))

    rng = random.Random(3)
    specs = [(f"g{n % 3}" if n < 36 else None, rng.choice([1, 2, 3])) for n in range(46)]
    rng.shuffle(specs)
    publisher = make_queue(callbacks={"rec": rec}, priorities=[1, 2, 3])
    jobs = {}
    for n, (group, priority) in enumerate(specs):
        jobs[f"t{n}"] = (publisher.publish("rec", [f"t{n}", group], serial_group=group, priority=priority),
                         group, priority)  # fmt: skip
    for name in ("A", "B"):
        workers(make_queue(callbacks={"rec": rec}, priorities=[1, 2, 3]), name=name)
    wait_until(lambda: len(runs) >= len(jobs), "every job to run", 20)
    # Once every result is written, no job can run again (a second run would need a claim).
    wait_until(
        lambda: _all_in(installed, [j for j, _, _ in jobs.values()], (JobState.FINISHED,)), "every result", 10
    )
    assert Counter(r[0] for r in runs) == Counter(jobs.keys()), "every job ran exactly once"
    for group in ("g0", "g1", "g2"):
        mine = sorted((r for r in runs if r[1] == group), key=lambda r: r[2])
        for before, after in zip(mine, mine[1:], strict=False):
            assert before[3] <= after[2], f"{before[0]} and {after[0]} of {group} overlap"
        expected = sorted(
            (t for t, (_, g, _) in jobs.items() if g == group), key=lambda t: (jobs[t][2], jobs[t][0])
        )
        assert [r[0] for r in mine] == expected, f"{group} did not run in (priority, id) order"


def test_a_worker_keeps_several_groups_and_hands_each_on_with_its_result(
    make_queue, installed, workers, monkeypatch
):
    """Work spread over many groups: a claim takes heads of several groups, and the worker keeps
    them: one hand_off writes several groups' results and claims their next heads, so claims are
    few, and every job of a group runs in order. It must not wait idle: nothing wakes it (the jobs
    were published before it started), so each such wait cost a whole poll."""
    ran: list[int] = []
    queue = make_queue(callbacks={"rec": ran.append})
    ids = [queue.publish("rec", [n], serial_group=f"g{n % 20}") for n in range(600)]
    heads_per_claim: list[int] = []
    handed_on: list[int] = []
    real_claim, real_hand_off = queue.procs.claim_batch, queue.procs.hand_off

    def claim(*args: Any, **kwargs: Any) -> Any:
        jobs = real_claim(*args, **kwargs)
        heads_per_claim.append(len({j.claim.serial_group for j in jobs}))
        return jobs

    def hand_off(*args: Any, **kwargs: Any) -> Any:
        written, heads = real_hand_off(*args, **kwargs)
        handed_on.append(len(heads))
        return written, heads

    left_when_idle: list[int] = []
    real_idle = bgq.modes.work._Worker._idle

    def idle(self: Any, waker: Any, wait: float) -> Any:
        left_when_idle.append(len(ids) - len(ran))
        return real_idle(self, waker, wait)

    monkeypatch.setattr(queue.procs, "claim_batch", claim)
    monkeypatch.setattr(queue.procs, "hand_off", hand_off)
    monkeypatch.setattr(bgq.modes.work._Worker, "_idle", idle)
    # Under load a group's chain of 30 jobs outlasts CHAIN_SECONDS, each group let go costs a
    # claim, and the count of claims below would measure the machine's speed, not the hand-off.
    monkeypatch.setattr(bgq.modes.work, "CHAIN_SECONDS", 3600.0)
    worker = workers(queue, poll=5.0)
    wait_until(lambda: len(ran) == len(ids), "every job to run", 30)
    assert worker.finish() == 0
    assert sorted(ran) == list(range(len(ids)))
    for g in range(20):
        assert [n for n in ran if n % 20 == g] == list(range(g, 600, 20)), f"g{g} ran out of order"
    assert max(heads_per_claim) > 1, heads_per_claim
    assert max(handed_on) > 1, "one hand-off claims several groups' next heads"
    assert sum(handed_on) > 10 * len(heads_per_claim), (len(heads_per_claim), sum(handed_on))
    assert [n for n in left_when_idle if n > 0] == [], "idle waits while jobs were left"


# --- stopping: DieException, stop requested ---


@pytest.mark.parametrize("grouped", [False, True], ids=["ungrouped", "grouped"])
def test_die_exception_stops_the_worker_before_the_next_job(
    make_queue, installed, workers, grouped, monkeypatch
):
    # Held jobs stay held until the DieException (on a loaded host a 1 s hold could give them
    # back first, and then no give-back at the DieException would be exercised).
    monkeypatch.setattr(bgq.modes.pipeline, "HOLD_SECONDS", 30.0)
    # Claims of 5 (a0-a4, a5-a9, then a10, a11, die, b0, b1), so that jobs are held behind the
    # DieException whatever the callbacks' timings: the adaptive size grows with how fast the
    # jobs ran, and could make `die` the last job of its claim (nothing held to give back).
    monkeypatch.setattr(bgq.modes.work._Worker, "_size", lambda self: 5)
    calls: list[str] = []
    held_at_die: list[int] = []
    group = "g" if grouped else None

    def rec(token: str) -> None:
        calls.append(token)

    def die(token: str) -> None:
        calls.append(token)
        held_at_die.extend(_held(installed, ids, calls))
        raise DieException("stop now")

    queue = make_queue(callbacks={"rec": rec, "die": die})
    ids = {f"a{n}": queue.publish("rec", [f"a{n}"], serial_group=group) for n in range(12)}
    ids["die"] = queue.publish("die", ["die"], serial_group=group)
    after = {f"b{n}": queue.publish("rec", [f"b{n}"], serial_group=group) for n in range(12)}
    ids.update(after)
    worker = workers(queue)
    assert worker.returned(15) == 0, "a DieException stops work() by itself, with exit code 0"
    assert queue.should_die
    assert calls == [f"a{n}" for n in range(12)] + ["die"], "no job ran after the DieException"
    rows = _rows(installed)
    assert rows[ids["die"]]["state"] == JobState.PERMANENTLY_FAILED
    assert rows[ids["die"]]["error_message"] == "stop now"
    assert all(rows[ids[f"a{n}"]]["state"] == JobState.FINISHED for n in range(12))
    for job in after.values():
        _assert_given_back(rows[job])
    assert not _processing(installed)
    if not grouped:
        assert held_at_die, "jobs were claimed ahead of the DieException (the give-back was exercised)"


@pytest.mark.parametrize("grouped", [False, True], ids=["ungrouped", "grouped"])
def test_stop_request_finishes_the_running_job_and_gives_back_the_claimed_ones(
    make_queue, installed, workers, grouped
):
    """The stop is requested while the worker holds claimed, unstarted jobs (ungrouped: a batch;
    grouped: the group's next job, claimed by the hand-off when the running one is written)."""
    calls: list[str] = []
    trigger: dict[str, Any] = {}
    group = "g" if grouped else None

    def rec(token: str) -> None:
        calls.append(token)
        if trigger:
            return
        held = _held(installed, ids, calls)
        if (grouped and len(calls) == 10) or (not grouped and len(calls) > 10 and len(held) >= 2):
            trigger.update(token=token, held=held)
            worker.stop.requested = True  # the running job still finishes and is written

    queue = make_queue(callbacks={"rec": rec})
    ids = {f"t{n}": queue.publish("rec", [f"t{n}"], serial_group=group) for n in range(60)}
    worker = workers(queue, run=False)
    worker.start()
    assert worker.returned(15) == 0
    assert trigger, "the stop was requested while jobs were held"
    rows = _rows(installed)
    assert rows[ids[trigger["token"]]]["state"] == JobState.FINISHED, "the running job's result is written"
    assert calls[-1] == trigger["token"], "no job started after the stop request"
    assert len(calls) == len(set(calls))
    for token, job in ids.items():
        if token in calls:
            assert rows[job]["state"] == JobState.FINISHED and rows[job]["number_of_attempts"] == 1
        else:
            _assert_given_back(rows[job])
    for job in trigger["held"]:
        _assert_given_back(rows[job])
    assert not _processing(installed), "no job stays PROCESSING after work() returned"


def test_held_jobs_are_given_back_while_a_slow_job_runs(make_queue, installed, workers, monkeypatch):
    """stalled_job_timeout 2 s -> a claimed job waits at most 1 s: worker A's batch mates of a slow
    job are given back and worker B runs them while A is still inside the slow job."""
    lock = threading.Lock()
    runs: list[tuple[str, str, float]] = []  # (token, worker, end)
    slow: dict[str, Any] = {}
    b_may_start = threading.Event()
    fake = FakeTime()  # the pipelines' clock, which says when a held job is stale
    monkeypatch.setattr(bgq.modes.pipeline, "time", fake)

    def run_by_b(held: list[int]) -> bool:
        queue_a.heartbeat()  # the slow job stays A's meanwhile: the reapers leave it alone
        with lock:
            return {ids[t] for t, who, _ in runs if who == "B"} >= set(held)

    def rec(token: str) -> None:
        me = threading.current_thread().name
        if me == "A" and not slow and len(runs) >= 10:
            held = _held(installed, ids, [r[0] for r in runs] + [token])
            if len(held) >= 3:
                slow.update(token=token, held=held)
                b_may_start.set()
                fake.advance(1.5)  # this job has run past the 1 s hold
                wait_until(lambda: run_by_b(held), "worker B to run the jobs A held", 15, 0.1)
                slow["end"] = time.monotonic()
        with lock:
            runs.append((token, me, time.monotonic()))

    queue_a = make_queue(callbacks={"rec": rec}, stalled_job_timeout=2, heartbeat_interval=0)
    ids = {f"t{n}": queue_a.publish("rec", [f"t{n}"]) for n in range(60)}
    workers(queue_a, name="A")
    assert b_may_start.wait(15), "worker A held jobs behind a running one"
    workers(make_queue(callbacks={"rec": rec}, stalled_job_timeout=2), name="B")
    wait_until(lambda: len(runs) >= len(ids), "every job to run", 20)
    assert Counter(r[0] for r in runs) == Counter(ids.keys()), "no job ran twice"
    by_id = {ids[token]: (who, end) for token, who, end in runs}
    for job in slow["held"]:
        who, end = by_id[job]
        assert who == "B" and end < slow["end"], f"job {job} waited for A's slow job ({who})"
    # The callbacks have all run; the last results may still be on their way (the writer thread
    # commits them after the callback returns): wait for them, then no job may have run twice.
    wait_until(
        lambda: all(r["state"] == JobState.FINISHED for r in _rows(installed).values()), "every result", 10
    )
    odd = {i: r["number_of_attempts"] for i, r in _rows(installed).items() if r["number_of_attempts"] != 1}
    assert not odd, odd


def test_a_held_job_cancelled_before_it_starts_is_recorded_cancelled_when_given_back(
    make_queue, installed, workers, monkeypatch
):
    """A job `bgq work` claimed ahead and holds counts as running, so its cancel is an abort
    request. When the worker gives it back unstarted (held past half of stalled_job_timeout
    behind a slow job), it is written REDUNDANT with the cancel's reason, not handed out again:
    it never runs, and the jobs after it do."""
    ran: list[str] = []
    cancelled: list[int] = []
    fake = FakeTime()  # the pipeline's clock, which says when a held job is stale
    monkeypatch.setattr(bgq.modes.pipeline, "time", fake)

    def given_back(held: list[int]) -> bool:
        queue.heartbeat()  # and this job is not reaped meanwhile
        return all(state_of(installed, job) == JobState.REDUNDANT for job in held)

    def rec(token: str) -> None:
        if not cancelled and len(ran) >= 10:
            held = _held(installed, ids, [*ran, token])
            if len(held) >= 3:
                for job in held:
                    assert queue.cancel(job, "not wanted").outcome == "abort_requested"
                    cancelled.append(job)
                fake.advance(1.5)  # past the 1 s hold: the held jobs are given back meanwhile
                wait_until(lambda: given_back(held), "the held jobs to be given back cancelled", 15, 0.1)
        ran.append(token)

    queue = make_queue(callbacks={"rec": rec}, stalled_job_timeout=2, heartbeat_interval=0)
    ids = {f"t{n}": queue.publish("rec", [f"t{n}"]) for n in range(60)}
    workers(queue, name="A")
    wait_until(
        lambda: all(state_of(installed, i) in (JobState.FINISHED, JobState.REDUNDANT) for i in ids.values()),
        "every job to finish or stay cancelled",
        20,
    )
    assert cancelled, "the worker never held 3 jobs behind a running one"
    by_token = {i: t for t, i in ids.items()}
    assert sorted(ran) == sorted(t for t, i in ids.items() if i not in cancelled)  # each once, none cancelled
    for job in cancelled:
        row = installed.sql("SELECT state, error_message, finished_at FROM {t} WHERE id = %s", (job,))[0]
        assert (row["state"], row["error_message"]) == (JobState.REDUNDANT, "Cancelled: not wanted"), (
            by_token[job]
        )
        assert row["finished_at"] is not None


def test_the_give_back_of_a_cancelled_claim_wakes_its_group(make_queue, installed):
    """At the procedure: a give-back (state 1) of a claim whose attempt was cancelled is written
    REDUNDANT and the group's next job may run; a plain give-back still returns the job to READY."""
    ran: list[str] = []
    queue = make_queue(callbacks={"rec": lambda token: ran.append(token)})
    first = queue.publish("rec", ["first"], serial_group="gb")
    queue.publish("rec", ["second"], serial_group="gb")
    plain = queue.publish("rec", ["plain"])
    for job in (first, plain):
        with queue.database.transaction() as conn:
            assert queue.procs.claim(conn, job, "general", 4242, 1000, None).outcome == "claimed"
    assert queue.cancel(first, "stop").outcome == "abort_requested"
    with queue.database.transaction() as conn:
        queue.procs.finish(conn, first, 1, JobState.READY, None, None, None, None)
        queue.procs.finish(conn, plain, 1, JobState.READY, None, None, None, None)
    row = installed.sql("SELECT * FROM {t} WHERE id = %s", (first,))[0]
    assert (row["state"], row["error_message"], row["number_of_attempts"]) == (
        JobState.REDUNDANT,
        "Cancelled: stop",
        1,
    )
    assert row["finished_at"] is not None
    _assert_given_back(installed.sql("SELECT * FROM {t} WHERE id = %s", (plain,))[0])
    queue.process()
    assert sorted(ran) == ["plain", "second"]


# --- configuration and options ---


def test_a_queue_with_a_broker_is_refused(make_queue, installed, cli):
    job = make_queue().publish("noop")
    broker_queue = make_queue(producer=object())
    with pytest.raises(ConfigError, match="broker"):
        work(broker_queue, stop=Stop())
    runner = cli()
    runner.env["BGQ_TEST_WORK_BROKER"] = "1"
    proc = runner.start("work")
    assert proc.wait(20) == 1
    assert "this queue has a broker: use `bgq consume`" in runner.output(proc)
    _assert_given_back(_row(installed, job))


def test_cli_priority_range_runs_only_those_priorities(make_queue, installed, cli):
    runner = cli()
    queue = make_queue(callbacks={"ledger": work_app.ledger}, priorities=[1, 2, 3])
    by_priority = {
        p: [queue.publish("ledger", [f"p{p}-{n}"], priority=p) for n in range(4)] for p in (1, 2, 3)
    }
    in_range = [queue.publish("ledger", ["g2"], serial_group="g", priority=2)]
    in_range.append(queue.publish("ledger", ["g3"], serial_group="g", priority=3))
    blocked = [queue.publish("ledger", ["h3"], serial_group="h", priority=3)]
    blocked.insert(0, queue.publish("ledger", ["h1"], serial_group="h", priority=1))  # h's head: p1
    proc = runner.start("work", "-p", "2-3")
    wanted = by_priority[2] + by_priority[3] + in_range
    # Priority 1 goes first in every claim: had the range let p1-* or h1 through, they would have
    # started before the jobs of priorities 2-3 were done.
    wait_until(lambda: _all_in(installed, wanted, TERMINAL), "the jobs of priorities 2-3", 20)
    assert runner.terminate(proc)[0] == 0
    rows = _rows(installed)
    assert all(rows[j]["state"] == JobState.FINISHED for j in wanted)
    for job in by_priority[1] + blocked:
        assert rows[job]["state"] == JobState.READY and rows[job]["number_of_attempts"] == 0, rows[job]
    started = {e["token"] for e in runner.events() if e["event"] == "start"}
    assert not started & {"p1-0", "p1-1", "p1-2", "p1-3", "h1", "h3"}


# --- the command line: SIGTERM, --concurrency, NOTIFY ---


def test_cli_sigterm_exits_0_after_the_running_job_is_written(make_queue, installed, cli):
    runner = cli()
    queue = make_queue(callbacks={"ledger": work_app.ledger}, priorities=[1, 2, 3])
    slow = queue.publish("ledger", ["slow", None, 2.0])
    proc = runner.start("work")
    wait_until(lambda: any(e["token"] == "slow" for e in runner.events()), "the slow job to start", 20)
    later = [queue.publish("ledger", [f"later{n}"]) for n in range(5)]
    code, _ = runner.terminate(proc, timeout=10)
    exited = time.time()
    assert code == 0, runner.output(proc)
    assert _row(installed, slow)["state"] == JobState.FINISHED
    events = [e for e in runner.events() if e["token"] == "slow"]
    assert [e["event"] for e in events] == ["start", "end"], "the running job was not cut short"
    assert exited - events[1]["at"] < 3.0, f"exit came {exited - events[1]['at']:.1f} s after the job ended"
    for job in later:
        _assert_given_back(_row(installed, job))
    assert not _processing(installed)
    assert not [e for e in runner.events() if e["token"].startswith("later")], "no job started after SIGTERM"


@pytest.mark.parametrize("poll", ["1", "30"])
def test_cli_sigterm_stops_an_idle_worker_promptly(installed, cli, poll):
    """Idle, even with a long --poll: an idle worker looks at its stop flag every 0.5 s."""
    runner = cli()
    proc = runner.start("work", "--poll", poll)
    runner.wait_ready(1)
    time.sleep(1.5)  # real: the process idles in its wait (no observable mark says it started waiting)
    code, took = runner.terminate(proc, timeout=40)
    assert code == 0, runner.output(proc)
    assert took < 3.0, f"an idle worker took {took:.1f} s to stop"


def test_cli_concurrency_2_runs_two_processes_and_sigterm_stops_all(make_queue, installed, cli):
    runner = cli()
    queue = make_queue(callbacks={"ledger": work_app.ledger}, priorities=[1, 2, 3])
    ids = [queue.publish("ledger", [f"t{n}", None, 0.1]) for n in range(60)]
    proc = runner.start("work", "--concurrency", "2")
    wait_until(lambda: sum(e["event"] == "end" for e in runner.events()) >= 10, "10 jobs to run", 20)
    code, took = runner.terminate(proc, timeout=15)
    assert code == 0, runner.output(proc)
    rows = _rows(installed)
    ran = [rows[i] for i in ids if rows[i]["state"] == JobState.FINISHED]
    pids = {r["pid"] for r in ran}
    assert len(pids) == 2 and proc.pid not in pids, f"two worker processes ran jobs: {pids}"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    for job in ids:
        if rows[job]["state"] != JobState.FINISHED:
            _assert_given_back(rows[job])
    assert not _processing(installed)
    ended = Counter(e["token"] for e in runner.events() if e["event"] == "end")
    assert all(v == 1 for v in ended.values()) and len(ended) == len(ran)


WAKE_POLL = 5  # --poll of the wake-up tests: a long-idle worker claims this many seconds apart


def _started_at(runner: Cli, token: str) -> float:
    """When the job `token`'s callback started (its 'start' event in the ledger), waiting for it."""
    found = wait_until(
        lambda: [e["at"] for e in runner.events() if e["token"] == token and e["event"] == "start"],
        f"the job {token} to start",
        3 * WAKE_POLL,
    )
    return float(found[0])


@pytest.mark.slow  # three idle waits longer than --poll 5: ~17 s
def test_cli_an_idle_worker_starts_a_new_job_at_once(make_queue, installed, cli):
    """Idle for longer than --poll, when its claims come `poll` seconds apart, a worker starts a
    newly published job within far less: PostgreSQL wakes on LISTEN (the insert trigger
    NOTIFYs), MySQL on its Prober (the table's newest id, read every few milliseconds). A worker
    that only polled would start each of these jobs within 1 s with probability 1/WAKE_POLL."""
    runner = cli()
    queue = make_queue(callbacks={"ledger": work_app.ledger}, priorities=[1, 2, 3])
    queue.publish("ledger", ["warm"])  # the publisher's first call checks the install: not timed
    proc = runner.start("work", "--poll", str(WAKE_POLL))
    _started_at(runner, "warm")
    took = []
    for n in range(3):
        time.sleep(WAKE_POLL + 0.5)  # real: the process idles longer than --poll, as a quiet worker does
        published = time.time()
        queue.publish("ledger", [f"wake{n}"])
        took.append(_started_at(runner, f"wake{n}") - published)
    code, _ = runner.terminate(proc)
    assert code == 0, runner.output(proc)
    shown = [round(t, 3) for t in took]
    assert max(took) < 1.0, f"publish -> callback start took {shown} s (--poll {WAKE_POLL})"


def test_cli_an_idle_worker_starts_a_postponed_job_once_due(make_queue, installed, cli):
    """A postponed job becoming due inserts nothing, so no waker sees it: the idle worker's own
    claims, at most --poll (1 s) apart, find it; not before it is due."""
    runner = cli()
    queue = make_queue(callbacks={"ledger": work_app.ledger}, priorities=[1, 2, 3])
    queue.publish("ledger", ["warm"])  # the publisher's first call checks the install: not timed
    proc = runner.start("work", "--poll", "1")
    _started_at(runner, "warm")
    time.sleep(1.5)  # real: the process idles, so its claims are --poll apart now
    published = time.time()
    queue.publish("ledger", ["due"], postpone_by=dt.timedelta(seconds=2))
    took = _started_at(runner, "due") - published
    code, _ = runner.terminate(proc)
    assert code == 0, runner.output(proc)
    assert 2.0 <= took < 2.0 + 1.0 + 1.5, f"a job due in 2 s started after {took:.2f} s (--poll 1)"


def test_the_waker_returns_when_a_job_is_published(make_queue, installed):
    """Procs.waker(): wait() returns False when nothing was published, and True soon after a
    publish on another connection."""
    queue = make_queue()
    waker = queue.store.procs.waker()
    try:
        began = time.monotonic()
        assert waker.wait(0.3) is False
        assert time.monotonic() - began >= 0.3
        timer = threading.Timer(0.2, lambda: queue.publish("noop"))
        timer.start()
        began = time.monotonic()
        assert waker.wait(5.0) is True
        took = time.monotonic() - began
        timer.join()
        assert took < 1.0, f"the waker saw the publish after {took:.2f} s"
        assert waker.wait(0.2) is False, "one publish wakes one wait"
    finally:
        waker.close()


def test_a_claim_slower_than_the_hold_still_runs_its_jobs(make_queue, installed, workers, monkeypatch):
    """A claim that takes longer than the hold (a loaded server, a large backlog) must not make its
    own jobs stale on arrival: once they were given back unstarted, claimed again, and none ran."""
    ran: list[int] = []
    # The hold is 1 s (HOLD_SECONDS, at most half of stalled_job_timeout), shorter than the claim;
    # the reaper may take a job claimed 4 s ago, far from the 1.3 s claim on a loaded host.
    queue = make_queue(callbacks={"rec": ran.append}, stalled_job_timeout=4)
    ids = [queue.publish("rec", [n]) for n in range(3)]
    real = queue.procs.claim_batch
    # the clock of `bgq work`'s claims, of its pipeline's hold, of the late-start check and the heartbeat
    fake = fake_time(monkeypatch, bgq.modes.work, bgq.modes.pipeline, bgq.jobs.executor, bgq.jobs.heartbeat)

    def slow_claim(*args, **kwargs):
        result = real(*args, **kwargs)
        fake.advance(1.3)  # 1.3 s inside the claim's transaction, before its commit
        return result

    monkeypatch.setattr(queue.procs, "claim_batch", slow_claim)
    workers(queue)
    wait_until(lambda: len(ran) == len(ids), "every job to run", 30)
    assert sorted(ran) == [0, 1, 2]


def test_a_job_reaped_before_it_started_is_not_run_by_the_late_worker(make_queue, installed, caplog):
    """A worker frozen between claiming a job and starting it (SIGSTOP, a paused VM) finds, when it
    resumes past half of stalled_job_timeout, that the job was reaped and claimed by another
    worker: it must not run the callback a second time (found by make chaos, cron mode)."""
    from bgq.modes.pipeline import Held
    from bgq.modes.work import _Worker

    ran: list[int] = []
    queue = make_queue(callbacks={"rec": ran.append}, stalled_job_timeout=2)
    job = queue.publish("rec", [1])
    with installed.db.transaction() as conn:
        (claimed,) = queue.procs.claim_batch(conn, "general", 1, 1, None, None, 1000)
    frozen_for = 5.0  # claimed "5 s ago", as a stopped process sees it on resume
    with installed.db.transaction() as conn:  # meanwhile: reaped, then claimed by another worker
        later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
        assert [r.id for r in queue.procs.reap(conn, "general", 2, 10, later, backoff_ms=0)] == [job]
    with installed.db.transaction() as conn:
        assert queue.procs.claim(conn, job, "general", 2, 1000, None).outcome == "claimed"
    worker = _Worker(queue, "general", None, Stop(), 1, 1.0)  # type: ignore[arg-type]
    held = Held(claimed, time.monotonic() - frozen_for, time.monotonic())
    with caplog.at_level(logging.WARNING, logger="bgq"):
        worker._run(held)
    assert ran == [], "the late worker ran a job another worker owns"
    assert "taken over before it started" in caplog.text
    row = installed.sql("SELECT state, number_of_attempts FROM {t} WHERE id = %s", (job,))[0]
    assert (row["state"], row["number_of_attempts"]) == (2, 2)  # the new owner's claim, untouched


def test_a_slow_writer_holds_back_the_claims_so_few_results_wait_unwritten(
    make_queue, installed, workers, monkeypatch
):
    """Backpressure: with commits slower than the jobs, the worker claims no more while
    `batch_max` results wait to be written, so the jobs run but not yet recorded (all to run again
    if the process died) stay about two batches' worth. Without it they reached nearly every job
    (the bench saw 14,000 on MariaDB 20 s after the last callback)."""
    ran, written, unwritten = [0], [0], []

    def job() -> None:
        ran[0] += 1
        unwritten.append(ran[0] - written[0])

    queue = make_queue(callbacks={"job": job})
    with queue.bulk():
        for _ in range(300):
            queue.publish("job")
    hand_off = queue.store.procs.hand_off

    def slow_hand_off(conn, results, *args, **kwargs):
        slow_write()
        out = hand_off(conn, results, *args, **kwargs)
        written[0] += len(results)
        return out

    monkeypatch.setattr(queue.store.procs, "hand_off", slow_hand_off)
    worker = workers(queue, batch_max=10)
    wait_until(lambda: written[0] >= 300, "every result written", 60)
    worker.finish()
    assert ran[0] == 300
    assert max(unwritten) <= 2 * 10, max(unwritten)


def test_an_exception_out_of_one_write_does_not_end_the_writer(
    make_queue, installed, workers, monkeypatch, caplog
):
    """An error that Executor.persist does not retry (not the database's) out of one write on the
    writer thread is logged and the writer goes on: every later result is still written and the
    worker stops cleanly. The failed batch's job stays PROCESSING for the reaper. (The writer
    thread used to die of it: no result was written any more.)"""
    queue = make_queue(callbacks={"noop": lambda: None})
    first = queue.publish("noop")
    hand_off, failed = queue.store.procs.hand_off, []

    def failing_once(conn, results, *args, **kwargs):
        if not failed:
            failed.extend(r.id for r in results)
            raise RuntimeError("one write failed")
        return hand_off(conn, results, *args, **kwargs)

    monkeypatch.setattr(queue.store.procs, "hand_off", failing_once)
    with caplog.at_level(logging.CRITICAL, logger="bgq"):
        worker = workers(queue)
        wait_until(lambda: failed, "the first write", 15)
        later = [queue.publish("noop") for _ in range(5)]
        wait_until(lambda: _all_in(installed, later, [JobState.FINISHED]), "every later result written", 15)
        assert worker.finish() == 0
    assert "bgq: Writing results failed; going on." in caplog.text
    assert failed == [first] and _states(installed, failed) == [JobState.PROCESSING]


@pytest.mark.parametrize("grouped", [False, True], ids=["ungrouped", "grouped"])
def test_a_failing_follow_up_costs_no_other_job_its_result_or_follow_up(
    make_queue, installed, workers, monkeypatch, caplog, grouped
):
    """A follow-up (Executor.after_finish) that raises after a result is written is logged; the
    other jobs' results and follow-ups still come, on the writer thread (ungrouped) and on the
    main thread after a hand-off (grouped), as in bgq consume. (It used to end the writer thread,
    or work() itself after a hand-off.)"""
    queue = make_queue(callbacks={"noop": lambda: None})
    ids = [queue.publish("noop", serial_group="g" if grouped else None) for _ in range(6)]
    calls = fail_first_follow_up(queue, monkeypatch)
    with caplog.at_level(logging.CRITICAL, logger="bgq"):
        worker = workers(queue)
        wait_until(lambda: _all_in(installed, ids, [JobState.FINISHED]), "every result written", 15)
        wait_until(lambda: len(calls) == len(ids), "every follow-up", 5)
        assert worker.finish() == 0
    assert f"bgq: Following up a written result failed. (ID: {calls[0]})" in caplog.text
    assert sorted(calls) == sorted(ids)
