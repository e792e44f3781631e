"""`bgq consume` in batches (RabbitMQ, both dialects): one claim transaction per batch, acknowledged
after it commits, a kill between that commit and the acknowledgements runs nothing twice, a serial
group taken in one batch still runs in order and one job at a time."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
from collections import Counter

from pika.adapters.blocking_connection import BlockingChannel

import bgq.jobs.executor
import bgq.jobs.heartbeat
import bgq.modes.consume
import bgq.modes.pipeline
from bgq import JobState
from bgq.modes.stopping import GracefulStop
from tests.conftest import AMQP_URL
from tests.support import ledger_worker
from tests.support.clock import fake_time
from tests.support.helpers import (
    PID,
    WAITING_MS,
    fail_first_follow_up,
    procs,
    slow_write,
    state_of,
    wait_until,
)


def _full_batches() -> None:
    """Jobs are taken for fast from the start: the first batch is as large as batch_max allows."""
    bgq.modes.consume.FIRST_ESTIMATE = 1e-6


def consume_in_batches(url, table, ledger, amqp_url, base, jobs=0, stalled=0, backoff=None) -> None:
    """A consumer process whose batches are full from its first take."""
    _full_batches()
    ledger_worker.consume_ledger(url, table, ledger, amqp_url, base, jobs, stalled, backoff)


def consume_then_die_before_acking(url, table, ledger, amqp_url, base) -> None:
    """A consumer process killed (SIGKILL) once its first batch's claim has committed, before it
    acknowledged any of the batch's messages."""
    _full_batches()

    def die(_delivery, _log) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    bgq.modes.consume._ack = die
    ledger_worker.consume_ledger(url, table, ledger, amqp_url, base)


def _process(target, *args):
    process = multiprocessing.get_context("spawn").Process(target=target, args=args)
    process.start()
    return process


def test_a_batch_is_claimed_in_one_transaction_and_acknowledged_after_it(
    broker_queue, rabbit, installed, monkeypatch
):
    """Ten messages taken together: their ten claims run in ONE transaction of the consumer (one
    call of {table}_claim_ids), and every message is acknowledged only once it has committed."""
    monkeypatch.setattr(bgq.modes.consume, "FIRST_ESTIMATE", 1e-6)
    queue = broker_queue(callbacks={"noop": lambda: None})
    ids = [queue.publish("noop") for _ in range(10)]
    executor, calls = queue.executor, queue.store.procs
    claims_per_transaction: list[int] = []
    events: list[str] = []
    claim_ids, retrying, ack = calls.claim_ids, executor.retrying, bgq.modes.consume._ack

    def counting_claim_ids(conn, job_ids, *args, **kwargs):
        claims_per_transaction[-1] += len(job_ids)
        return claim_ids(conn, job_ids, *args, **kwargs)

    def counting_retrying(call):
        claims_per_transaction.append(0)
        result = retrying(call)
        events.append("committed")
        return result

    def recording_ack(delivery, log):
        events.append("ack")
        assert state_of(installed, int(delivery.body)) == JobState.PROCESSING  # the claim is visible
        ack(delivery, log)

    monkeypatch.setattr(calls, "claim_ids", counting_claim_ids)
    monkeypatch.setattr(executor, "retrying", counting_retrying)
    monkeypatch.setattr(bgq.modes.consume, "_ack", recording_ack)
    with GracefulStop() as stop:
        assert bgq.modes.consume.consume(queue, None, 10, [1], stop, batch_max=10) == 0
    assert [c for c in claims_per_transaction if c] == [10]
    assert events == ["committed"] + ["ack"] * 10
    assert all(state_of(installed, i) == JobState.FINISHED for i in ids)
    wait_until(lambda: rabbit.count(f"{rabbit.base}_1") == 0, "the queue is empty", 10, 0.1)


def test_a_batch_is_acknowledged_by_one_basic_ack_sent_after_its_claim_committed(
    broker_queue, rabbit, installed, monkeypatch
):
    """The ten messages of a batch cost RabbitMQ one basic.ack(multiple), not ten, and it goes
    out only after the claim's transaction committed."""
    monkeypatch.setattr(bgq.modes.consume, "FIRST_ESTIMATE", 1e-6)
    queue = broker_queue(callbacks={"noop": lambda: None})
    ids = [queue.publish("noop") for _ in range(10)]
    events: list[object] = []
    retrying, basic_ack = queue.executor.retrying, BlockingChannel.basic_ack

    def counting_retrying(call):
        result = retrying(call)
        events.append("committed")
        return result

    def recording_basic_ack(channel, delivery_tag=0, multiple=False):
        events.append(("basic.ack", multiple))
        return basic_ack(channel, delivery_tag, multiple)

    monkeypatch.setattr(queue.executor, "retrying", counting_retrying)
    monkeypatch.setattr(BlockingChannel, "basic_ack", recording_basic_ack)
    with GracefulStop() as stop:
        assert bgq.modes.consume.consume(queue, None, 10, [1], stop, batch_max=10) == 0
    assert events == ["committed", ("basic.ack", True)]
    assert all(state_of(installed, i) == JobState.FINISHED for i in ids)
    wait_until(lambda: rabbit.count(f"{rabbit.base}_1") == 0, "the queue is empty", 10, 0.1)


def test_a_consumer_killed_between_the_claim_commit_and_the_acks_runs_no_job_twice(
    broker_queue, rabbit, installed, ledger
):
    """The victim claims a batch of five and is killed before it acknowledges any: the five
    messages come back, the survivor finds the jobs PROCESSING (claimed: 'unexpected') and drops
    the copies; its reaper gives the jobs back after stalled_job_timeout (with no backoff, so
    the test does not wait out the default minute) and each runs once."""
    queue = broker_queue(callbacks={"ledger": ledger_worker.ledger_job})
    ids = [queue.publish("ledger", [f"k{i}"]) for i in range(5)]
    victim = _process(
        consume_then_die_before_acking, installed.url, installed.table, ledger, AMQP_URL, rabbit.base
    )
    victim.join(60)
    assert victim.exitcode == -signal.SIGKILL
    assert [state_of(installed, i) for i in ids] == [JobState.PROCESSING] * 5
    assert ledger_worker.read_ledger(installed.url, ledger) == []
    wait_until(
        lambda: rabbit.count(f"{rabbit.base}_1") == 5, "the 5 messages back in the queue", 10, 0.1
    )  # unacknowledged: back
    survivor = _process(
        consume_in_batches, installed.url, installed.table, ledger, AMQP_URL, rabbit.base, 0, 2, 0
    )
    try:
        wait_until(
            lambda: all(state_of(installed, i) == JobState.FINISHED for i in ids),
            "every job FINISHED",
            90,
            0.1,
        )
    finally:
        survivor.terminate()
        survivor.join(30)
    assert survivor.exitcode == 0
    starts = Counter(
        token for _, token, _, event in ledger_worker.read_ledger(installed.url, ledger) if event == "start"
    )
    assert starts == {f"k{i}": 1 for i in range(5)}


def test_a_group_taken_in_one_batch_runs_in_order_and_one_job_at_a_time(
    broker_queue, rabbit, installed, ledger
):
    """Seed Test 6 with batches: the group's priority-1 jobs reach one consumer in one batch (its
    claims in one transaction make all but the head WAITING), two consumers, order a b d e g c f,
    never two jobs of the group at once."""
    queue = broker_queue(callbacks={"ledger": ledger_worker.ledger_job})
    ids = [
        queue.publish("ledger", [m[0], "demo"], serial_group="demo", priority=int(m[1]))
        for m in ("a1", "b1", "c2", "d1", "e1", "f2", "g1")
    ]
    procs = [
        _process(consume_in_batches, installed.url, installed.table, ledger, AMQP_URL, rabbit.base)
        for _ in range(2)
    ]
    try:
        wait_until(
            lambda: all(state_of(installed, i) == JobState.FINISHED for i in ids),
            "every job FINISHED",
            60.0,
            0.1,
        )
        for _ in range(2):
            queue.config.producer.publish_die(rabbit.base)
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            p.kill() if p.is_alive() else None
    events = ledger_worker.read_ledger(installed.url, ledger)
    assert [token for _, token, _, event in events if event == "start"] == list("abdegcf")
    for i in range(0, len(events), 2):
        assert events[i][3] == "start" and events[i + 1][3] == "end" and events[i][1] == events[i + 1][1]


def test_a_failing_follow_up_costs_no_other_job_its_result_or_follow_up(
    broker_queue, installed, monkeypatch, caplog
):
    """A follow-up that raises after a result is written (in production: a broker send whose
    BROKER_FAILED mark met a cut database) must not end the writer thread: every later result is
    still written, so no job is left PROCESSING for the reaper to run again."""
    monkeypatch.setattr(bgq.modes.consume, "FIRST_ESTIMATE", 1e-6)
    queue = broker_queue(callbacks={"noop": lambda: None})
    ids = [queue.publish("noop") for _ in range(6)]
    calls = fail_first_follow_up(queue, monkeypatch)
    with caplog.at_level(logging.CRITICAL, logger="bgq"), GracefulStop() as stop:
        assert bgq.modes.consume.consume(queue, None, 6, [1], stop, batch_max=1) == 0
    assert f"Following up a written result failed. (ID: {calls[0]})" in caplog.text
    assert sorted(calls) == sorted(ids)  # every other job's follow-up still ran
    assert [state_of(installed, i) for i in ids] == [JobState.FINISHED] * 6


def test_a_slow_writer_holds_back_the_takes_so_few_results_wait_unwritten(
    broker_queue, installed, monkeypatch
):
    """Backpressure, as in bgq work: with commits slower than the jobs, no message is taken while
    `batch_max` results wait to be written (jobs run but not recorded stay about two batches)."""
    monkeypatch.setattr(bgq.modes.consume, "FIRST_ESTIMATE", 1e-6)
    ran, written, unwritten = [0], [0], []

    def job() -> None:
        ran[0] += 1
        unwritten.append(ran[0] - written[0])

    queue = broker_queue(callbacks={"job": job})
    ids = [queue.publish("job") for _ in range(120)]
    finish_batch = queue.store.procs.finish_batch

    def slow_finish_batch(conn, results, *args, **kwargs):
        slow_write()
        out = finish_batch(conn, results, *args, **kwargs)
        written[0] += len(results)
        return out

    finish = queue.store.procs.finish

    def slow_finish(conn, *args, **kwargs):  # a batch of one result is written by finish
        slow_write()
        out = finish(conn, *args, **kwargs)
        written[0] += 1
        return out

    monkeypatch.setattr(queue.store.procs, "finish_batch", slow_finish_batch)
    monkeypatch.setattr(queue.store.procs, "finish", slow_finish)
    with GracefulStop() as stop:
        assert bgq.modes.consume.consume(queue, None, 120, [1], stop, batch_max=5) == 0
    assert [state_of(installed, i) for i in ids] == [JobState.FINISHED] * 120
    assert max(unwritten) <= 2 * 5, max(unwritten)


def test_a_grouped_job_given_back_sends_the_job_its_group_promoted(
    broker_queue, rabbit, installed, monkeypatch
):
    """A consumer takes a slow job and a group's head H in one batch; H waits past the hold and is
    given back. Meanwhile B, a better-priority job of H's group, was taken by another consumer
    and turned WAITING behind H. The give-back wakes the group, which promotes B: B's id must be
    sent then (not left to the lost-message pass, an hour later), and B runs before H."""
    monkeypatch.setattr(bgq.modes.consume, "FIRST_ESTIMATE", 1e-6)
    ran: list[str] = []
    b_waiting = threading.Event()
    # the clock of the consumer's takes, of its pipeline's hold, of the late-start check and the heartbeat
    fake = fake_time(
        monkeypatch, bgq.modes.consume, bgq.modes.pipeline, bgq.jobs.executor, bgq.jobs.heartbeat
    )

    def slow() -> None:
        ran.append("slow")
        assert b_waiting.wait(20), "B never turned WAITING"
        fake.advance(1.5)  # this job has run past the 1 s hold: H, held behind it, is given back
        wait_until(lambda: state_of(installed, head) != JobState.PROCESSING, "H to be given back", 15)

    queue = broker_queue(callbacks={"slow": slow, "rec": ran.append})
    queue.publish("slow", priority=2)
    head = queue.publish("rec", ["H"], serial_group="g", priority=2)
    stop = GracefulStop()
    consumer = threading.Thread(
        target=bgq.modes.consume.consume, args=(queue, None, 0, [1, 2, 3], stop), kwargs={"batch_max": 10}
    )
    consumer.start()
    try:
        wait_until(
            lambda: state_of(installed, head) == JobState.PROCESSING, "the head is PROCESSING", 15, 0.1
        )
        better = queue.publish("rec", ["B"], serial_group="g", priority=1)
        # Another consumer takes B's message and claims B: WAITING behind the running H.
        wait_until(lambda: rabbit.count(f"{rabbit.base}_1") == 1, "one message in the queue", 5, 0.1)
        assert rabbit.bodies(f"{rabbit.base}_1") == [str(better)]
        with installed.db.transaction() as conn:
            taken = procs(installed).claim(conn, better, rabbit.base, PID, WAITING_MS, None)
        assert taken.outcome != "claimed" and state_of(installed, better) == JobState.WAITING, taken
        b_waiting.set()
        wait_until(
            lambda: ran[-2:] == ["B", "H"],
            f"B then H ran (ran {ran}; B is {state_of(installed, better)})",
            20,
            0.1,
        )
    finally:
        stop.requested = True
        consumer.join(30)
    assert ran == ["slow", "B", "H"]
