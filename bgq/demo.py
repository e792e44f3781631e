"""`bgq demo`: the canonical serial group a1 b1 c2 d1 e1 f2 g1 runs as a b d e g c f."""

from __future__ import annotations

import time
from collections.abc import Callable

from .queue import Queue
from .states import TERMINAL, JobState

CANONICAL = "a1 b1 c2 d1 e1 f2 g1"  # letter = publish order, digit = priority
EXPECTED = "a b d e g c f"
DEMO_TABLE = "bgq_demo"


def run_demo(database_url: str | None = None, out: Callable[[str], None] = print) -> str:
    """Publish, process and report; returns the order the group ran in."""
    order: list[str] = []

    def step(letter: str) -> None:
        out(f"  start  {letter}  (group demo, priority {dict(_jobs())[letter]})")
        time.sleep(0.05)
        order.append(letter)
        out(f"  finish {letter}")

    def ungrouped(name: str) -> None:
        out(f"  start  {name}  (no group)")
        out(f"  finish {name}")

    queue = Queue(
        callbacks={"step": step, "ungrouped": ungrouped},
        database_url=database_url,
        queue="demo",
        table_name=DEMO_TABLE,
        priorities=[1, 2],
    )
    try:
        out(f"bgq demo on {queue.database.dialect.name} ({queue.database.safe_url})")
        queue.install()
        with queue.database.transaction() as conn:
            queue.procs.delete_all(conn)
        ids = []
        for letter, priority in _jobs():
            ids.append(queue.publish("step", [letter], serial_group="demo", priority=priority))
        for name in ("mail-1", "mail-2", "mail-3"):
            ids.append(queue.publish("ungrouped", {"name": name}, priority=2))
        out(f"published {CANONICAL} in serial group 'demo', and 3 jobs without a group")
        for run in range(1, 21):
            out(f"bgq process (run {run})")
            queue.process()
            if all(JobState(queue.get_job(i)["state"]) in TERMINAL for i in ids):
                break
            time.sleep(1.1)  # WAITING jobs are retried once waiting_job_expiration has passed
        ran = " ".join(order)
        out(f"the group ran in the order: {ran}")
        out(f"expected (priority, then id): {EXPECTED}")
        return ran
    finally:
        queue.close()


def _jobs() -> list[tuple[str, int]]:
    return [(item[0], int(item[1:])) for item in CANONICAL.split()]
