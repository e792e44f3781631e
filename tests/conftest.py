"""Shared fixtures: real MariaDB and PostgreSQL, one freshly installed table per dialect per session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
import sqlalchemy as sa

from bgq import Queue
from bgq.db import Database
from bgq.sql.install import install, uninstall
from tests.support.helpers import unique_name

# PyMySQL >= 1.2 builds a TLS context for every new connection unless told not to (its default
# "preferred" mode loads the system CA store: ~25 ms of CPU a connection, even against a server
# without TLS, as here); the suite opens thousands of connections over loopback, so it says so.
DATABASE_URLS = {
    "mysql": os.environ.get(
        "BGQ_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test?ssl_disabled=true"
    ),
    "postgres": os.environ.get("BGQ_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
}
SERVICE_NAMES = {"mysql": "MariaDB/MySQL", "postgres": "PostgreSQL"}
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
_reachable: dict[str, str | None] = {}


def require_service(name: str, probe: Callable[[], None]) -> None:
    """Skip (or, with CI=true, fail) when a service the test needs is not reachable."""
    if name not in _reachable:
        try:
            probe()
            _reachable[name] = None
        except Exception as exc:  # any failure to connect
            _reachable[name] = f"{type(exc).__name__}: {exc}"
    if _reachable[name] is not None:
        message = f"{name} is not reachable ({_reachable[name]})"
        if IN_CI:
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)


def _probe_database(url: str) -> Callable[[], None]:
    def probe() -> None:
        engine = sa.create_engine(url, connect_args={"connect_timeout": 5})
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
        finally:
            engine.dispose()

    return probe


@pytest.fixture(params=["mysql", "postgres"])
def dialect(request: pytest.FixtureRequest) -> str:
    name = request.param
    require_service(SERVICE_NAMES[name], _probe_database(DATABASE_URLS[name]))
    return name


@pytest.fixture
def db_url(dialect: str) -> str:
    return DATABASE_URLS[dialect]


# --- dialect differences: each side asserts its own behaviour ---

_DIALECT_DIFFERS = "dialect_differs"


@pytest.fixture
def dialect_expects(request: pytest.FixtureRequest, dialect: str) -> Any:
    """What this dialect is expected to do, from the test's marker
    `@pytest.mark.dialect_differs(mysql=..., postgres=..., reason="why they differ")`:
    the test asserts against it, so both dialects' behaviour is asserted, none skipped."""
    marker = request.node.get_closest_marker(_DIALECT_DIFFERS)
    assert marker is not None, (
        "dialect_expects needs @pytest.mark.dialect_differs(mysql=, postgres=, reason=)"
    )
    return marker.kwargs[dialect]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A dialect_differs marker names both dialects' behaviour and why, and is read by its test.
    The `slow` tests run first: spread over xdist workers (`make test`), the longest ones start
    at once instead of being left for last, when nothing else could run beside them."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    for item in items:
        marker = item.get_closest_marker(_DIALECT_DIFFERS)
        if marker is None:
            continue
        if marker.args or set(marker.kwargs) != {"mysql", "postgres", "reason"}:
            raise pytest.UsageError(f"{item.nodeid}: dialect_differs takes mysql=, postgres= and reason=")
        if "dialect_expects" not in getattr(item, "fixturenames", ()):
            raise pytest.UsageError(f"{item.nodeid}: dialect_differs without the dialect_expects fixture")


class Installed:
    """A table with bgq installed, shared by the tests of one dialect in this session."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.table = unique_name()
        self.db = Database(url)
        install(self.db, self.table)

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Run raw SQL on the test table; `{t}` stands for the table name."""
        with self.db.engine.begin() as conn:
            result = conn.exec_driver_sql(statement.format(t=self.table), params)
            return [dict(r) for r in result.mappings().all()] if result.returns_rows else []

    def clear(self) -> None:
        self.sql("DELETE FROM {t}")
        self.sql("DELETE FROM {t}_group")
        self.sql("DELETE FROM {t}_worker")
        for control in ("paused", "schedule", "fired"):  # a pause or a schedule must not outlive its test
            self.sql(f"DELETE FROM {{t}}_{control}")

    def drop(self) -> None:
        uninstall(self.db, self.table)
        self.db.dispose()


_installed: dict[str, Installed] = {}


@pytest.fixture
def installed(dialect: str) -> Iterator[Installed]:
    """The session's installed table for this dialect, emptied before the test."""
    if dialect not in _installed:
        _installed[dialect] = Installed(DATABASE_URLS[dialect])
    target = _installed[dialect]
    target.clear()
    yield target


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for target in _installed.values():
        target.drop()


@pytest.fixture
def make_queue(installed: Installed) -> Iterator[Callable[..., Queue]]:
    """Build Queues on the installed table: make_queue(callbacks={...}, priorities=[1, 2], ...)."""
    queues: list[Queue] = []

    def factory(**options: Any) -> Queue:
        options.setdefault("callbacks", {"noop": lambda *a, **k: None})
        options.setdefault("database_url", installed.url)
        options.setdefault("table_name", installed.table)
        options.setdefault("queue", "general")
        queue = Queue(**options)
        queues.append(queue)
        return queue

    yield factory
    for queue in queues:
        queue.close()


# --- RabbitMQ (broker mode) ---

AMQP_URL = os.environ.get("BGQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
DELAYS = (1000, 5000, 60_000, 120_000)


def probe_rabbitmq() -> None:
    pika.BlockingConnection(pika.URLParameters(AMQP_URL + "?connection_attempts=1&socket_timeout=3")).close()


class Rabbit:
    """Unique queue names for one test, reading messages, and cleanup."""

    def __init__(self) -> None:
        self.base = f"bq{uuid.uuid4().hex[:8]}"
        self.conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        self.channel = self.conn.channel()

    def names(self) -> list[str]:
        out = []
        for p in range(4):
            out.append(f"{self.base}_{p}")
            out.extend(f"{self.base}_{p}_{d}" for d in DELAYS)
        return out

    def count(self, name: str) -> int:
        try:
            return self.channel.queue_declare(name, passive=True).method.message_count
        except pika.exceptions.ChannelClosedByBroker:
            self.channel = self.conn.channel()
            return 0

    def bodies(self, name: str) -> list[str]:
        out = []
        while True:
            try:
                method, _, body = self.channel.basic_get(name, auto_ack=True)
            except pika.exceptions.ChannelClosedByBroker:
                self.channel = self.conn.channel()
                return out
            if method is None:
                return out
            out.append(body.decode())

    def purge(self) -> None:
        for name in self.names():
            self.bodies(name)

    def close(self) -> None:
        for name in self.names():
            for delete in (self.channel.queue_delete, self.channel.exchange_delete):
                try:
                    delete(name)
                except pika.exceptions.ChannelClosedByBroker:
                    self.channel = self.conn.channel()
        self.conn.close()


@pytest.fixture
def rabbit():
    require_service("RabbitMQ", probe_rabbitmq)
    target = Rabbit()
    yield target
    target.close()


@pytest.fixture
def broker_queue(make_queue, rabbit):
    from bgq.broker.rabbitmq import RabbitMQ

    producers: list[RabbitMQ] = []  # the application owns its producer: Queue.close() leaves it open

    def factory(**options):
        if "producer" not in options:
            options["producer"] = RabbitMQ(AMQP_URL)
            producers.append(options["producer"])
        options.setdefault("priorities", [1, 2, 3])
        options.setdefault("queue", rabbit.base)
        return make_queue(**options)

    yield factory
    for producer in producers:
        producer.close()


@pytest.fixture
def ledger(installed: Installed) -> Iterator[str]:
    """A ledger table (start/end events of callbacks, in commit order) for the concurrency proofs."""
    from tests.support import ledger_worker

    name = unique_name("ledger")
    ledger_worker.create_ledger(installed.url, name)
    yield name
    ledger_worker.drop_ledger(installed.url, name)
