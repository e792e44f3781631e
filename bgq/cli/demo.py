"""`bgq demo`: the canonical serial group a1 b1 c2 d1 e1 f2 g1 runs as a b d e g c f."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

from ..model import TERMINAL, JobState
from ..queue import Queue
from ..sql.install import uninstall

CANONICAL = "a1 b1 c2 d1 e1 f2 g1"  # letter = publish order, digit = priority
EXPECTED = "a b d e g c f"
DEMO_TABLE = "bgq_demo"
DEMO_QUEUE = "bgqdemo"
CONSUMERS = 2


def step(letter: str, priority: int) -> None:
    print(f"  start  {letter}  (group demo, priority {priority}, pid {os.getpid()})", flush=True)
    time.sleep(0.05)
    print(f"  finish {letter}", flush=True)


def ungrouped(name: str) -> None:
    print(f"  start  {name}  (no group, pid {os.getpid()})", flush=True)
    print(f"  finish {name}", flush=True)


def _queue(database_url: str | None, broker_url: str | None) -> Queue:
    producer = None
    if broker_url:
        from ..broker.rabbitmq import RabbitMQ

        producer = RabbitMQ(broker_url)
    return Queue(
        callbacks={"step": step, "ungrouped": ungrouped},
        database_url=database_url,
        queue=DEMO_QUEUE,
        table_name=DEMO_TABLE,
        priorities=[1, 2],
        producer=producer,
    )


def _consumer(database_url: str | None, broker_url: str) -> None:
    from ..modes.consume import consume
    from ..modes.stopping import GracefulStop

    queue = _queue(database_url, broker_url)
    with GracefulStop() as stop:
        consume(queue, None, 0, [1, 2], stop)
    queue.close()


def run_demo(
    database_url: str | None = None, broker_url: str | None = None, out: Callable[[str], None] = print
) -> str:
    """Publish, process (cron mode, or two consumers with a broker) and report the group's order."""
    queue = _queue(database_url, broker_url)
    consumers: list[Any] = []
    try:
        mode = f"broker mode, {CONSUMERS} consumers on {broker_url}" if broker_url else "cron mode"
        out(f"bgq demo on {queue.database.dialect.name} ({queue.database.safe_url}), {mode}")
        # The demo owns its table: it starts from a fresh install, whatever an earlier bgq left there.
        uninstall(queue.database, DEMO_TABLE)
        queue.install()
        if broker_url:  # consumers first: they wait on the queues the publisher fills
            ctx = multiprocessing.get_context("spawn")
            url = queue.config.database_url or queue.database.url.render_as_string(hide_password=False)
            consumers = [ctx.Process(target=_consumer, args=(url, broker_url)) for _ in range(CONSUMERS)]
            for process in consumers:
                process.start()
        ids: dict[str, int] = {}
        for item in CANONICAL.split():
            letter, priority = item[0], int(item[1:])
            ids[letter] = _published(
                queue.publish("step", [letter, priority], serial_group="demo", priority=priority)
            )
        others = [
            _published(queue.publish("ungrouped", {"name": f"mail-{n}"}, priority=2)) for n in (1, 2, 3)
        ]
        out(f"published {CANONICAL} in serial group 'demo', and 3 jobs without a group")
        for run in range(1, 61):
            if not broker_url:
                out(f"bgq process (run {run})")
                queue.process()
            if all(JobState(_row(queue, i)["state"]) in TERMINAL for i in [*ids.values(), *others]):
                break
            time.sleep(1.1 if not broker_url else 0.5)  # cron mode retries WAITING jobs after 1 s
        started = {letter: _row(queue, job_id)["last_attempt_at"] for letter, job_id in ids.items()}
        ran = " ".join(sorted((s for s in started if started[s] is not None), key=lambda s: started[s]))
        out(f"the group ran in the order: {ran}")
        out(f"expected (priority, then id): {EXPECTED}")
        return ran
    finally:
        if consumers:
            for _ in consumers:
                queue.config.producer.publish_die(DEMO_QUEUE)
            for process in consumers:
                process.join(30)
                if process.is_alive():
                    process.terminate()
        queue.close()


def _published(job_id: int | None) -> int:
    """publish() outside a bulk always returns the new job's id."""
    assert job_id is not None
    return job_id


def _row(queue: Queue, job_id: int) -> dict[str, Any]:
    row = queue.get_job(job_id)
    assert row is not None, f"job {job_id} vanished"
    return row
