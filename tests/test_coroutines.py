"""Coroutine callbacks and hooks in every worker mode, and `publish_async`, on both dialects.

Cron (`bgq process`), work (`bgq work --concurrency 2`) and broker (`bgq consume`) run as real
processes on tests/support/async_app.py, whose callbacks and hooks are all `async def` and write to a
ledger which process ran what on which event loop. In-process tests cover the heartbeat from a
coroutine, a caller already inside a running loop, a forked child's own loop and publish_async.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections import defaultdict

import pytest

from bgq import JobState, PriorityError, PublishError, SerializationError, UnknownCallbackError
from bgq.jobs import coroutines
from tests.conftest import AMQP_URL
from tests.support.cli import BGQ
from tests.support.clock import Clock
from tests.support.helpers import state_of, wait_until
from tests.support.work_app import ROOT, read_ledger


def noop(*args, **kwargs):
    return None


def count_rows(installed) -> int:
    return installed.sql("SELECT COUNT(*) AS n FROM {t}")[0]["n"]


def row_of(installed, job_id: int) -> dict:
    (row,) = installed.sql("SELECT * FROM {t} WHERE id = %s", (job_id,))
    return row


@pytest.fixture
def app_env(installed, ledger):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BGQ_")}
    env.update(
        BGQ_TEST_WORK_URL=installed.url, BGQ_TEST_WORK_TABLE=installed.table, BGQ_TEST_WORK_LEDGER=ledger
    )
    return env


def _publish(queue, tokens):
    greet = {t: queue.publish("greet", [t]) for t in tokens}
    return greet, queue.publish("fail", ["bad"])


def _check_ledger(installed, ledger, greet: dict[str, int], bad: int, processes: int | None = None) -> None:
    """Every job's callback and hooks ran as coroutines, each process on one loop it reused."""
    events = read_ledger(installed.url, ledger)
    by_token = defaultdict(list)
    loops_by_pid = defaultdict(set)
    for e in events:
        by_token[e["token"]].append(e["event"])
        loops_by_pid[e["pid"]].add(e["grp"])
    for token, job_id in greet.items():
        assert by_token[token] == ["before", "run", "after"], (token, events)
        assert state_of(installed, job_id) == JobState.FINISHED
    assert by_token["bad"] == ["before", "error"], events
    failed = row_of(installed, bad)
    assert (
        failed["state"] == JobState.TEMPORARILY_FAILED and failed["error_message"] == "ValueError: failed bad"
    )
    for pid, loops in loops_by_pid.items():
        assert len(loops) == 1, (pid, loops)  # one loop per worker process, reused for every job
    if processes is None:
        assert len(loops_by_pid) == 1  # the whole run was one process: every job on the same loop
    for job_id in [*greet.values(), bad]:
        meta = row_of(installed, job_id)["metadata"]
        meta = json.loads(meta) if isinstance(meta, str) else meta
        assert meta["loop"] in loops_by_pid[meta["pid"]]  # the async metadata hook ran on that loop


def test_coroutines_in_cron_mode(make_queue, installed, ledger, app_env):
    queue = make_queue(callbacks={"greet": noop, "fail": noop}, priorities=[1, 2])
    greet, bad = _publish(queue, ["a", "b", "c"])
    result = subprocess.run(
        [BGQ, "--app", "tests.support.async_app:queue", "process"], cwd=ROOT, env=app_env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    _check_ledger(installed, ledger, greet, bad)


def test_coroutines_in_work_mode_with_forked_workers(make_queue, installed, ledger, app_env, tmp_path):
    queue = make_queue(callbacks={"greet": noop, "fail": noop}, priorities=[1, 2])
    greet, bad = _publish(queue, [f"w{i}" for i in range(8)])
    log = (tmp_path / "work.log").open("wb")
    proc = subprocess.Popen(
        [BGQ, "--app", "tests.support.async_app:queue", "work", "--concurrency", "2"],
        cwd=ROOT, env=app_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        wait_until(
            lambda: (
                all(state_of(installed, i) == JobState.FINISHED for i in greet.values())
                and state_of(installed, bad) == JobState.TEMPORARILY_FAILED
            ),
            "the jobs to run",
            60,
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
    _check_ledger(installed, ledger, greet, bad, processes=2)


def test_coroutines_in_broker_mode(broker_queue, installed, ledger, app_env, rabbit):
    queue = broker_queue(callbacks={"greet": noop, "fail": noop}, priorities=[1, 2])
    greet, bad = _publish(queue, ["x", "y"])
    app_env.update(BGQ_TEST_ASYNC_AMQP=AMQP_URL, BGQ_TEST_ASYNC_QUEUE=rabbit.base)
    result = subprocess.run(
        [BGQ, "--app", "tests.support.async_app:queue", "consume", "-j", "3"], cwd=ROOT, env=app_env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    _check_ledger(installed, ledger, greet, bad)


# --- in process ----------------------------------------------------------------------------------


def test_heartbeat_from_a_coroutine_callback_moves_updated_at(make_queue, installed):
    seen, clock = {}, Clock()
    queue = make_queue(heartbeat_interval=0, clock=clock)

    @queue.task
    async def long(job: str) -> None:
        (row,) = installed.sql("SELECT id, updated_at FROM {t} WHERE callback_name = 'long'")
        await asyncio.sleep(0)
        clock.advance(0.05)  # 50 ms into the job
        queue.heartbeat()
        (later,) = installed.sql("SELECT updated_at FROM {t} WHERE id = %s", (row["id"],))
        seen["before"], seen["after"] = row["updated_at"], later["updated_at"]

    job_id = long.publish("j")
    queue.process()
    assert state_of(installed, job_id) == JobState.FINISHED
    assert seen["after"] > seen["before"]


def test_coroutine_hooks_can_replace_the_error_and_the_loop_is_reused(make_queue, installed):
    loops = []

    async def on_error(exc, parameters):
        loops.append(asyncio.get_running_loop())
        raise PermissionError("replaced by the async on_error")

    queue = make_queue(on_error=on_error)

    @queue.task
    async def boom() -> None:
        loops.append(asyncio.get_running_loop())
        raise ValueError("original")

    first, second = boom.publish(), boom.publish()
    queue.process()
    assert row_of(installed, first)["error_message"] == "PermissionError: replaced by the async on_error"
    assert state_of(installed, second) == JobState.TEMPORARILY_FAILED
    assert len(loops) == 4 and all(loop is loops[0] for loop in loops)  # one loop, reused
    assert loops[0] is coroutines.event_loop() and not loops[0].is_closed()


def test_a_coroutine_callbacks_exception_carries_no_context_of_bgqs(make_queue, installed, caplog):
    """The loop is chosen before the coroutine runs: its exception reaches on_error and the log
    without a chained "RuntimeError: no running event loop"."""
    seen = []
    queue = make_queue(on_error=lambda exc, parameters: seen.append(exc), notify_on_number_of_attempts=1)

    @queue.task
    async def boom() -> None:
        raise ValueError("original")

    job_id = boom.publish()
    with caplog.at_level("WARNING", logger="bgq"):
        queue.process()
    assert state_of(installed, job_id) == JobState.TEMPORARILY_FAILED
    assert [type(e) for e in seen] == [ValueError]
    assert seen[0].__context__ is None and seen[0].__cause__ is None
    assert "ValueError: original" in caplog.text  # (the traceback of the first attempt's notice)
    assert "no running event loop" not in caplog.text


def test_process_called_from_inside_a_running_loop_runs_coroutines_on_a_helper_thread(make_queue, installed):
    ran = {}
    queue = make_queue()

    @queue.task
    async def job(n: int) -> None:
        ran[n] = asyncio.get_running_loop()

    ids = [job.publish(1), job.publish(2)]

    async def app() -> None:
        queue.process()  # a synchronous call from a coroutine: its loop cannot run a second one here
        ran["caller"] = asyncio.get_running_loop()

    asyncio.run(app())
    assert [state_of(installed, i) for i in ids] == [JobState.FINISHED] * 2
    assert ran[1] is ran[2] and ran[1] is not ran["caller"]


def test_a_forked_child_gets_its_own_loop():
    parent = coroutines.event_loop()
    assert coroutines.event_loop() is parent  # reused
    pid = os.fork()
    if pid == 0:  # the child: a loop of its own, which then runs coroutines
        try:
            child = coroutines.event_loop()
            ok = child is not parent and coroutines.run(asyncio.sleep(0, "ran")) == "ran"
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# --- publish_async -------------------------------------------------------------------------------


def test_publish_async_writes_a_job_that_runs(make_queue, installed):
    calls = []
    queue = make_queue(callbacks={"rec": lambda *a, **k: calls.append((a, k))}, priorities=[1, 2])

    async def app():
        one = await queue.publish_async("rec", [1, "a"], serial_group="g", priority=2)
        two = await queue.publish_async("rec", {"x": 2}, postpone_by=0)
        await queue.aclose()
        return one, two

    one, two = asyncio.run(app())
    row = row_of(installed, one)
    assert (row["serial_group"], row["priority"], row["state"]) == ("g", 2, JobState.READY)
    queue.process()
    assert [state_of(installed, i) for i in (one, two)] == [JobState.FINISHED] * 2
    assert sorted(calls, key=str) == sorted([((1, "a"), {}), ((), {"x": 2})], key=str)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda q: q.publish_async("missing"), UnknownCallbackError),
        (lambda q: q.publish_async("noop", [], priority=7), PriorityError),
        (lambda q: q.publish_async("noop", [object()]), SerializationError),
        (lambda q: q.publish_async("noop", [], mode="unique"), PublishError),
        (lambda q: q.publish_async("noop", [], serial_group="x" * 256), PublishError),
    ],
)
def test_publish_async_bad_input_raises_the_same_typed_errors_and_writes_nothing(
    make_queue, installed, call, error
):
    queue = make_queue()
    with pytest.raises(error):
        asyncio.run(call(queue))
    with pytest.raises(error):  # the sync publish raises the same class for the same input
        asyncio.run(asyncio.to_thread(lambda: call_sync(queue, call)))
    assert count_rows(installed) == 0


def call_sync(queue, call):
    """Run the same call through the synchronous publish: publish_async's arguments, publish."""

    class Sync:
        def publish_async(self, *args, **kwargs):
            return queue.publish(*args, **kwargs)

    return call(Sync())


def test_task_publish_async_checks_arguments(make_queue, installed):
    queue = make_queue()

    @queue.task
    async def fetch(url: str) -> None: ...

    async def app():
        job_id = await fetch.configure(identifier="u", mode="unique").publish_async("https://x")
        with pytest.raises(PublishError, match="missing a required argument"):
            await fetch.publish_async()
        with pytest.raises(PublishError, match="takes no connection"):
            await fetch.configure(connection=object()).publish_async("https://y")
        return job_id

    job_id = asyncio.run(app())
    assert count_rows(installed) == 1 and row_of(installed, job_id)["identifier"] == "u"


def test_many_concurrent_publish_async_calls_get_distinct_ids(make_queue, installed):
    queue = make_queue()

    async def app(start):
        return await asyncio.gather(*(queue.publish_async("noop", [start + i]) for i in range(60)))

    first = asyncio.run(app(0))
    second = asyncio.run(app(100))  # a second loop: a connection of its own
    ids = [*first, *second]
    assert len(set(ids)) == 120
    rows = installed.sql("SELECT id, parameters_json FROM {t}")
    stored = {r["id"]: json.loads(r["parameters_json"]) if isinstance(r["parameters_json"], str)
              else r["parameters_json"] for r in rows}  # fmt: skip
    assert {i: stored[i] for i in ids} == {
        i: [n] for i, n in zip(ids, [*range(60), *range(100, 160)], strict=True)
    }


def test_publish_async_reaches_the_broker(broker_queue, installed, rabbit):
    queue = broker_queue(priorities=[1, 2])
    job_id = asyncio.run(queue.publish_async("noop", [], priority=2))
    assert rabbit.bodies(f"{rabbit.base}_2") == [str(job_id)]
    assert row_of(installed, job_id)["processed_by_broker"]


def test_publish_async_lets_the_loops_other_tasks_run_while_it_waits(make_queue, installed):
    """Neither path blocks the loop: another task runs while the INSERTs wait (PostgreSQL on the
    async connection, MySQL on a thread). A blocking insert would never yield to the ticker."""
    queue = make_queue()

    async def app():
        await queue.publish_async("noop", [0])  # the first call's one-time install check is done
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        started = time.monotonic()
        ids = [await queue.publish_async("noop", [i]) for i in range(5)]
        task.cancel()
        return ids, ticks, time.monotonic() - started

    ids, ticks, _ = asyncio.run(app())
    assert len(set(ids)) == 5 and ticks > 0  # the loop ran other work while publishes waited
    assert count_rows(installed) == 6


@pytest.mark.parametrize("dialect", ["postgres"], indirect=True)  # MySQL's path is the engine's pool
def test_publish_async_replaces_a_connection_the_server_ended(make_queue, installed, monkeypatch):
    from bgq.db import aio_postgres

    monkeypatch.setattr(aio_postgres, "PING_AFTER", 0.0)  # ping before every use
    queue = make_queue()

    async def app():
        first = await queue.publish_async("noop", [1])
        slot = queue.database.aio._slots[asyncio.get_running_loop()]
        old = slot.conn
        installed.sql("SELECT pg_terminate_backend(%s)", (old.info.backend_pid,))
        second = await queue.publish_async("noop", [2])  # the ping finds it gone: a new connection
        assert slot.conn is not old and old.closed
        return first, second

    first, second = asyncio.run(app())
    assert first != second and count_rows(installed) == 2


def test_a_coroutine_in_the_callbacks_dict_runs_with_keyword_parameters(make_queue, installed):
    got = []

    async def notify(user: int, text: str = "") -> None:
        await asyncio.sleep(0)
        got.append((user, text))

    queue = make_queue(callbacks={"notify": {"callback": notify, "priority": 2}}, priorities=[1, 2])
    job_id = queue.publish("notify", {"user": 3, "text": "hi"})
    queue.process()
    assert got == [(3, "hi")] and state_of(installed, job_id) == JobState.FINISHED
