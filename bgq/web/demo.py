"""Demo data for `bgq web --demo` (`make web`): real jobs in every state a console shows."""

from __future__ import annotations

import datetime as dt
import logging
import random
from typing import Any

from ..errors import PermanentErrorException
from ..modes.registry import version
from ..queue import Queue
from ..sql.install import uninstall

DEMO_TABLE = "bgq_console_demo"
DEMO_QUEUE = "shop"


def send_mail(to: str, subject: str = "") -> None:
    """Always works."""


def charge(order: int, amount: float) -> None:
    """Fails for a while: a temporary failure, retried with backoff."""
    if order % 3 == 0:
        raise ConnectionError(f"payment gateway timed out for order {order}")


def import_feed(url: str) -> None:
    """A programming error: fails for good."""
    raise PermanentErrorException(f"feed {url} has no <items> element")


def sync_stock(sku: str) -> None:
    """A serial group's step."""


def render_report(rows: Any) -> None:
    """Takes pickled parameters (a set is not JSON)."""


CALLBACKS = {
    "send_mail": send_mail,
    "charge": charge,
    "import_feed": import_feed,
    "sync_stock": sync_stock,
    "render_report": render_report,
}


def demo_queue(database_url: str | None) -> Queue:
    # The demo's failures are on purpose: their log records (with tracebacks) would only be noise.
    quiet = logging.getLogger("bgq.web.demo")
    quiet.setLevel(logging.CRITICAL + 1)
    return Queue(
        logger=quiet,
        callbacks=CALLBACKS,
        database_url=database_url,
        table_name=DEMO_TABLE,
        queue=DEMO_QUEUE,
        priorities=[1, 2, 3],
        allow_pickle=True,
        permanent_errors=(PermanentErrorException,),
    )


def seed(queue: Queue, seed_value: int = 7) -> None:
    """Install the demo table afresh, publish a mixed workload, run part of it, and leave the rest: finished,
    failed (temporarily and for good), postponed, serial groups with a backlog (one group named
    `<script>alert(1)</script>`: the console shows it as text, one paused), pickled parameters,
    two registered workers and two schedules."""
    rnd = random.Random(seed_value)
    uninstall(queue.database, queue.config.table_name)  # the demo owns its table: a fresh install
    queue.install()
    for n in range(40):
        queue.publish("send_mail", {"to": f"user{n}@example.com", "subject": "Your order"}, priority=2)
    for order in range(1, 13):
        queue.publish("charge", {"order": order, "amount": round(rnd.uniform(5, 500), 2)}, priority=1)
    for url in ("https://example.com/a.xml", "https://example.com/b.xml"):
        queue.publish("import_feed", [url], priority=3)
    queue.process(max_runtime=30)  # the first wave runs: finished, TEMPORARILY and PERMANENTLY_FAILED
    heads: dict[str, int] = {}
    for warehouse in ("warehouse-east", "warehouse-west", "<script>alert(1)</script>"):
        for sku in range(rnd.randint(3, 7)):
            job_id = queue.publish(
                "sync_stock", [f"SKU-{sku:04d}"], serial_group=warehouse, priority=1 if sku == 0 else 2
            )
            assert job_id is not None  # publish outside a bulk returns the id
            heads.setdefault(warehouse, job_id)
    # Two registered workers (the workers page; dead once worker_dead_after passes without a
    # heartbeat), one inside warehouse-east's head; warehouse-west's head failed and waits for its backoff.
    with queue.database.transaction() as conn:
        worker = queue.procs.worker_register(conn, "worker-1", 4242, "work", DEMO_QUEUE, version())
        queue.procs.worker_register(conn, "worker-2", 4250, "consume", DEMO_QUEUE, version())
    with queue.database.transaction() as conn:
        queue.procs.claim(
            conn, heads["warehouse-east"], DEMO_QUEUE, 4242, 1000, '{"host": "worker-1"}', worker_id=worker
        )
    with queue.database.transaction() as conn:
        queue.procs.worker_heartbeat(conn, worker, heads["warehouse-east"], 57)
    with queue.database.transaction() as conn:
        claimed = queue.procs.claim(conn, heads["warehouse-west"], DEMO_QUEUE, 4243, 1000, None)
    assert claimed.attempt is not None  # its group was idle: the claim succeeded
    with queue.database.transaction() as conn:
        queue.procs.finish(
            conn, heads["warehouse-west"], claimed.attempt, 4,
            "TimeoutError: the warehouse API did not answer", 300_000, 1200, None,
        )  # fmt: skip
    queue.publish("render_report", [{1, 2, 3}], identifier="report-2026-12", mode="unique")
    queue.publish("send_mail", {"to": "later@example.com"}, postpone_by=dt.timedelta(hours=2))
    for n in range(5):
        queue.publish("send_mail", {"to": f"new{n}@example.com"}, priority=2)
    for sku in range(3):  # a paused group: nothing of it starts until someone resumes it
        queue.publish("sync_stock", [f"SKU-{sku:04d}"], serial_group="warehouse-north", priority=2)
    queue.pause("the north warehouse is moving", group="warehouse-north", by="ada")
    queue.schedule("nightly-report", "30 2 * * *", "render_report", [[]], timezone="Europe/Prague")
    queue.schedule("stock-sync", "*/15 * * * *", "sync_stock", ["ALL"], serial_group="warehouse-east")
    queue.fire_schedules()  # stores them (a running worker would)
