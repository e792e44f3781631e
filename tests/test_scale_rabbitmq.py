"""A RabbitMQ cluster (docs/scale-out/rabbitmq.md), the parts testable on the machine's one broker.

URL lists and the order a process tries them in, failover to the next URL for publishing and
consuming, quorum queues for every queue bgq declares (priority, control and delay queues), and the
errors of a queue that exists with another type. The three-node cluster itself, and a node killed
under load, are tools/scale/rabbitmq.py's (`python -m tools.scale --topology rabbitmq`).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator

import pytest

from bgq.broker import BrokerConnectionError, BrokerError
from bgq.broker.rabbitmq import RabbitMQ, _Nodes, parse_urls
from bgq.errors import ConfigError
from tests.broker.conftest import AMQP_URL, Rabbit, _probe
from tests.conftest import require_service


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def rabbit() -> Iterator[Rabbit]:
    require_service("RabbitMQ", _probe)
    helper = Rabbit()
    try:
        yield helper
    finally:
        helper.cleanup()


@pytest.fixture
def dead_url() -> str:
    return f"amqp://guest:s3cret@127.0.0.1:{_closed_port()}/"


def _alias(url: str) -> str:
    """The same broker under another URL (localhost for 127.0.0.1): a second 'node' to fail over to."""
    assert "127.0.0.1" in url, url
    return url.replace("127.0.0.1", "localhost")


# --- URL lists ---


def test_one_url_several_in_a_string_or_a_sequence() -> None:
    a, b, c = (f"amqp://guest:guest@127.0.0.1:{p}/" for p in (5681, 5682, 5683))
    assert parse_urls(a) == [a]
    assert parse_urls(f"{a} {b}\t{c}\n") == [a, b, c]
    assert parse_urls([a, b, c]) == [a, b, c]
    assert parse_urls((c, f"{a} {b}")) == [c, a, b]
    assert parse_urls([a, b, a]) == [a, b]  # a duplicate is dropped, the first place kept


@pytest.mark.parametrize(
    "given, message",
    [
        ("", "No RabbitMQ URL"),
        ([], "No RabbitMQ URL"),
        ("   ", "No RabbitMQ URL"),
        ("http://127.0.0.1:5672/", "amqp://"),
        (["amqp://127.0.0.1/", 5672], "must be a str"),
    ],
)
def test_bad_url_lists_are_config_errors(given: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RabbitMQ(given)  # type: ignore[arg-type]


def test_the_single_url_form_is_unchanged() -> None:
    broker = RabbitMQ("amqp://guest:s3cret@127.0.0.1:1/")
    assert broker.urls == ["amqp://guest:s3cret@127.0.0.1:1/"]
    assert broker.url == "amqp://guest:s3cret@127.0.0.1:1/"
    assert repr(broker) == "RabbitMQ('amqp://guest:***@127.0.0.1:1/')"
    assert "s3cret" not in repr(RabbitMQ("amqp://u:s3cret@h1/ amqp://u:s3cret@h2/"))


def test_given_order_starts_at_the_first_url_and_a_lost_connection_moves_on() -> None:
    nodes = _Nodes(["amqp://h1/", "amqp://h2/", "amqp://h3/"], "test", "given")
    assert nodes.attempt_order() == [0, 1, 2]
    nodes.current = 0  # as connect() leaves it after a connection to h1
    nodes.lost()
    assert nodes.attempt_order() == [1, 2, 0]
    nodes.current = 2
    nodes.lost()
    assert nodes.attempt_order() == [0, 1, 2]
    nodes.lost()  # nothing in use: no change
    assert nodes.attempt_order() == [0, 1, 2]


def test_random_order_is_a_rotation_of_the_list_and_spreads_the_processes() -> None:
    urls = ["amqp://h1/", "amqp://h2/", "amqp://h3/"]
    firsts = set()
    for _ in range(200):
        order = _Nodes(urls, "test", "random").attempt_order()
        assert order in ([0, 1, 2], [1, 2, 0], [2, 0, 1])
        firsts.add(order[0])
    assert firsts == {0, 1, 2}


def test_url_order_and_queue_type_are_validated() -> None:
    with pytest.raises(ConfigError, match="url_order"):
        RabbitMQ(AMQP_URL, url_order="shuffled")
    with pytest.raises(ConfigError, match="queue_type"):
        RabbitMQ(AMQP_URL, queue_type="stream")
    with pytest.raises(ConfigError, match="contradicts"):
        RabbitMQ(AMQP_URL, queue_type="quorum", queue_arguments={"x-queue-type": "classic"})


@pytest.mark.parametrize(
    "options",
    [
        {"queue_type": "quorum", "queue_arguments": {"x-max-priority": 10}},
        {"queue_arguments": {"x-queue-type": "quorum", "x-queue-mode": "lazy"}},
        {"queue_type": "quorum", "per_queue_arguments": {"transcribe": {"x-max-priority": 5}}},
    ],
    ids=["max-priority", "lazy", "per-queue"],
)
def test_arguments_a_quorum_queue_refuses_are_config_errors(options: dict) -> None:
    with pytest.raises(ConfigError, match="quorum queue refuses"):
        RabbitMQ(AMQP_URL, **options)


# --- failover on the machine's broker ---


def test_publish_fails_over_to_the_second_url(rabbit: Rabbit, dead_url: str) -> None:
    broker, q = rabbit.broker([dead_url, AMQP_URL], url_order="given"), rabbit.name()
    started = time.monotonic()
    broker.publish(7, q, 1)
    assert time.monotonic() - started < 3  # a refused port costs nothing
    assert broker.url == AMQP_URL
    assert rabbit.count(f"{q}_1") == 1


def test_consume_fails_over_to_the_second_url(rabbit: Rabbit, dead_url: str) -> None:
    q = rabbit.name()
    rabbit.broker().publish(8, q, 2)
    consumer = rabbit.consumer(rabbit.broker(f"{dead_url} {AMQP_URL}", url_order="given"))
    delivery = consumer.take(q, [1, 2], timeout=2)
    assert delivery is not None and delivery.body == "8"
    delivery.ack()
    assert consumer.url == AMQP_URL


def test_no_reachable_url_names_every_node_without_passwords(rabbit: Rabbit, dead_url: str) -> None:
    other = f"amqp://guest:s3cret@127.0.0.1:{_closed_port()}/"
    broker = rabbit.broker([dead_url, other])
    started = time.monotonic()
    with pytest.raises(BrokerConnectionError, match="any of its 2 nodes") as raised:
        broker.publish(1, "bgqt_unreachable", 1)
    with pytest.raises(BrokerConnectionError, match="any of its 2 nodes"):
        rabbit.consumer(broker).take("bgqt_unreachable", [1], timeout=0.1)
    assert time.monotonic() - started < 3
    text = str(raised.value)
    assert dead_url.replace("s3cret", "***") in text and other.replace("s3cret", "***") in text
    assert "s3cret" not in text


def _kill_socket(connection) -> None:  # as tests/broker/test_rabbitmq.py does: the peer "dies"
    connection._impl._transport._sock.shutdown(socket.SHUT_RDWR)


def test_a_lost_connection_moves_the_producer_and_the_consumer_to_the_next_url(
    rabbit: Rabbit, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bgq.broker")
    urls = [AMQP_URL, _alias(AMQP_URL)]
    broker, q = rabbit.broker(urls, url_order="given"), rabbit.name()
    broker.publish(1, q, 1)
    assert broker.url == urls[0]
    _kill_socket(broker._connection)
    broker.publish(2, q, 1)  # the publish retries once, on the next node
    assert broker.url == urls[1]
    consumer = rabbit.consumer(broker)
    first = consumer.take(q, [1], timeout=2)
    assert first is not None and consumer.url == urls[0]
    first.ack()
    _kill_socket(consumer._connection)
    second = consumer.take(q, [1], timeout=2)
    assert second is not None and consumer.url == urls[1]
    second.ack()
    assert sorted([first.body, second.body]) == ["1", "2"]
    moves = [r.getMessage() for r in caplog.records if "reconnected to" in r.getMessage()]
    assert len(moves) == 2  # one warning line per move, naming both nodes
    assert all(m.startswith("bgq: Lost the RabbitMQ connection to amqp://guest:***@") for m in moves)
    assert all(m.endswith("reconnected to amqp://guest:***@localhost:5672/.") for m in moves)


# --- quorum queues ---


def test_queue_type_quorum_declares_main_control_and_delay_queues_quorum(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(queue_type="quorum"), rabbit.name()
    rabbit.queues.add(f"{q}_1_400")
    sent = time.monotonic()
    broker.publish(1, q, 1, delay_ms=400)
    broker.publish_die(q)
    quorum = {"x-queue-type": "quorum"}
    assert rabbit.declare_fails(f"{q}_1", quorum) is None
    assert rabbit.declare_fails(f"{q}_0", quorum) is None
    delay = {
        **quorum,
        "x-dead-letter-exchange": f"{q}_1",
        "x-dead-letter-routing-key": f"{q}_1",
        "x-message-ttl": 400,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }
    assert rabbit.declare_fails(f"{q}_1_400", delay) is None
    assert rabbit.declare_fails(f"{q}_1", None) == 406  # not classic queues
    assert rabbit.declare_fails(f"{q}_1_400", quorum) == 406

    consumer = rabbit.consumer(broker)
    die = consumer.take(q, [1], timeout=2)
    assert die is not None and die.body == "die"
    die.ack()
    assert consumer.take(q, [1], timeout=0.1) is None  # still in the delay queue
    delivery = consumer.take(q, [1], timeout=5)
    assert delivery is not None and delivery.body == "1"  # through the quorum delay queue
    delivery.ack()
    assert 0.35 < time.monotonic() - sent < 5  # its 400 ms TTL, counted from the publish


def test_a_classic_queue_of_the_same_name_gives_a_clear_error(rabbit: Rabbit) -> None:
    q = rabbit.name()
    rabbit.broker().publish(1, q, 1)  # classic queues, as a bgq without queue_type declared them
    quorum = rabbit.broker(queue_type="quorum")
    with pytest.raises(BrokerError, match="406") as raised:
        quorum.publish(2, q, 1)
    text = str(raised.value)
    assert "another type" in text and f"rabbitmqctl delete_queue {q}_1" in text
    with pytest.raises(BrokerError, match=f"delete_queue {q}_1"):
        rabbit.consumer(quorum).take(q, [1], timeout=0.1)
    assert rabbit.count(f"{q}_1") == 1  # the classic queue and its message are untouched
