"""Fixtures for the RabbitMQ broker tests: a real server, unique queue names, and cleanup."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from pika import exceptions as pe

from bgq.broker.rabbitmq import RabbitConsumer, RabbitMQ, redact
from tests.conftest import require_service
from tests.support.helpers import wait_until

AMQP_URL = os.environ.get("BGQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")


def _parameters() -> pika.URLParameters:
    params = pika.URLParameters(AMQP_URL)
    params.connection_attempts = 1
    params.socket_timeout = 3
    params.stack_timeout = 5
    params.heartbeat = 0
    return params


def _probe() -> None:
    try:
        pika.BlockingConnection(_parameters()).close()
    except pe.AMQPError as exc:  # its str() is often empty; the repr names the cause
        raise ConnectionError(f"{redact(AMQP_URL)}: {exc!r}") from None


class Rabbit:
    """The test's view of the server: makes brokers and queue names, inspects queues, cleans up."""

    def __init__(self) -> None:
        self.url = AMQP_URL
        self._connection: pika.BlockingConnection | None = None
        self._brokers: list[RabbitMQ] = []
        self._consumers: list[RabbitConsumer] = []
        self.queues: set[str] = set()
        self.exchanges: set[str] = set()

    def name(self, suffix: str = "", priorities: tuple[int, ...] = (0, 1, 2)) -> str:
        """A unique base queue name; '<base>_<p>' queues and exchanges are deleted at the end."""
        base = f"bgqt_{uuid.uuid4().hex[:8]}{suffix}"
        for p in priorities:
            self.queues.add(f"{base}_{p}")
            self.exchanges.add(f"{base}_{p}")
        return base

    def broker(self, url: str | None = None, **options: Any) -> RabbitMQ:
        broker = RabbitMQ(url or self.url, **options)
        self._brokers.append(broker)
        return broker

    def consumer(self, broker: RabbitMQ) -> RabbitConsumer:
        consumer = broker.consumer()
        self._consumers.append(consumer)
        return consumer

    def channel(self) -> Any:
        """A fresh channel on the test's own connection (a broker error closes only that channel)."""
        if self._connection is None or not self._connection.is_open:
            self._connection = pika.BlockingConnection(_parameters())
        return self._connection.channel()

    def count(self, queue: str) -> int:
        """Messages ready in `queue` (passive declare); the queue must exist."""
        channel = self.channel()
        try:
            return channel.queue_declare(queue, passive=True).method.message_count
        finally:
            channel.close()

    def consumers(self, queue: str) -> int:
        """Subscriptions on `queue` (passive declare); the queue must exist."""
        channel = self.channel()
        try:
            return channel.queue_declare(queue, passive=True).method.consumer_count
        finally:
            channel.close()

    def count_eventually(self, queue: str, expected: int, within: float = 1.0) -> int:
        """`expected`, once the count is that (polled for `within` s: requeues are async)."""
        wait_until(lambda: self.count(queue) == expected, f"{expected} message(s) in {queue}", within)
        return expected

    def exists(self, queue: str) -> bool:
        channel = self.channel()
        try:
            channel.queue_declare(queue, passive=True)
        except pe.ChannelClosedByBroker as exc:
            assert exc.reply_code == 404, exc
            return False
        channel.close()
        return True

    def declare_fails(self, queue: str, arguments: dict[str, Any] | None, durable: bool = True) -> int | None:
        """Declare `queue` with these settings: None if they match the existing queue, else the reply code."""
        channel = self.channel()
        try:
            channel.queue_declare(queue, durable=durable, arguments=arguments)
        except pe.ChannelClosedByBroker as exc:
            return exc.reply_code
        channel.close()
        return None

    def cleanup(self) -> None:
        for consumer in self._consumers:
            consumer.close()
        for broker in self._brokers:
            broker.close()
        if self.queues or self.exchanges:
            channel = self.channel()
            for queue in sorted(self.queues):
                channel.queue_delete(queue)
            for exchange in sorted(self.exchanges):
                channel.exchange_delete(exchange)
        if self._connection is not None and self._connection.is_open:
            self._connection.close()


@pytest.fixture
def rabbit() -> Iterator[Rabbit]:
    """A real RabbitMQ (BGQ_TEST_AMQP_URL); skips when unreachable, fails instead when CI=true."""
    require_service("RabbitMQ", _probe)
    helper = Rabbit()
    try:
        yield helper
    finally:
        helper.cleanup()
