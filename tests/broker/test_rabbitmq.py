"""bgq.broker.rabbitmq against a real RabbitMQ: publish, delay, preference, ack/reject, errors, reconnects."""

from __future__ import annotations

import socket
import time

import pytest
from pika import exceptions as pe
from pika.adapters.blocking_connection import BlockingChannel

from bgq.broker import BrokerConnectionError, BrokerError
from bgq.broker.rabbitmq import _Topology, connection_parameters, redact
from bgq.errors import ConfigError

from .conftest import Rabbit


def _take(rabbit: Rabbit, broker, queue: str, priorities=(1, 2), timeout: float = 2.0):
    return rabbit.consumer(broker).take(queue, list(priorities), timeout)


def _kill_socket(connection) -> None:
    """Cut the TCP connection under pika's feet, as a broker restart or a network drop would."""
    connection._impl._transport._sock.shutdown(socket.SHUT_RDWR)


# --- publish and take ---


def test_publish_then_take_returns_the_id_and_the_priority(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(42, q, 2)
    delivery = _take(rabbit, broker, q)
    assert delivery is not None
    assert (delivery.body, delivery.priority) == ("42", 2)
    delivery.ack()
    assert rabbit.count(f"{q}_2") == 0


def test_messages_are_persistent_and_queues_and_exchanges_durable(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(7, q, 1)
    channel = rabbit.channel()
    method, properties, body = channel.basic_get(f"{q}_1", auto_ack=True)
    assert body == b"7"
    assert properties.delivery_mode == 2
    assert properties.content_type == "text/plain"
    assert rabbit.declare_fails(f"{q}_1", None, durable=False) == 406  # inequivalent arg 'durable'
    assert rabbit.declare_fails(f"{q}_1", None, durable=True) is None
    channel = rabbit.channel()
    with pytest.raises(pe.ChannelClosedByBroker, match="durable"):
        channel.exchange_declare(f"{q}_1", exchange_type="direct", durable=False)


def test_priority_zero_is_refused(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    with pytest.raises(BrokerError, match="control queue"):
        broker.publish(1, q, 0)


def test_delayed_message_arrives_only_after_its_ttl(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    delay_queue = f"{q}_1_300"
    rabbit.queues.add(delay_queue)
    published = time.monotonic()
    broker.publish(9, q, 1, delay_ms=300)
    consumer = rabbit.consumer(broker)
    assert rabbit.exists(delay_queue)
    delivery = consumer.take(q, [1], timeout=0.1)
    if delivery is None:  # the usual case: asked for well inside the TTL
        delivery = consumer.take(q, [1], timeout=3)
    # Counted from the publish: on a loaded machine the consumer may only be ready after it.
    assert time.monotonic() - published >= 0.3, "delivered before its TTL"
    assert delivery is not None
    assert (delivery.body, delivery.priority) == ("9", 1)
    delivery.ack()
    dead_letter = {"x-dead-letter-exchange": f"{q}_1", "x-dead-letter-routing-key": f"{q}_1"}
    assert rabbit.declare_fails(delay_queue, {**dead_letter, "x-message-ttl": 300}) is None
    assert rabbit.declare_fails(delay_queue, {**dead_letter, "x-message-ttl": 301}) == 406


@pytest.mark.parametrize(("priorities", "first", "left"), [([1, 2], "1", 2), ([2, 1], "2", 1)])
def test_the_most_preferred_queue_wins_and_the_other_message_stays(
    rabbit: Rabbit, priorities: list[int], first: str, left: int
) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(2, q, 2)
    broker.publish(1, q, 1)
    delivery = rabbit.consumer(broker).take(q, priorities, timeout=2)
    assert delivery is not None
    assert (delivery.body, delivery.priority) == (first, int(first))
    delivery.ack()
    assert rabbit.count_eventually(f"{q}_{left}", 1) == 1
    assert rabbit.count(f"{q}_{first}") == 0


def test_the_control_queue_beats_every_priority(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(1, q, 1)
    broker.publish(2, q, 2)
    broker.publish_die(q)
    consumer = rabbit.consumer(broker)
    delivery = consumer.take(q, [1, 2], timeout=2)
    assert delivery is not None
    assert (delivery.body, delivery.priority) == ("die", 0)
    delivery.ack()
    assert rabbit.count_eventually(f"{q}_1", 1) == 1
    assert rabbit.count_eventually(f"{q}_2", 1) == 1


def test_publish_die_goes_to_the_control_queue(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish_die(q)
    assert rabbit.count(f"{q}_0") == 1
    delivery = _take(rabbit, broker, q)
    assert delivery is not None
    assert (delivery.body, delivery.priority) == ("die", 0)
    delivery.ack()


QUEUE_TYPES = pytest.mark.parametrize(
    "queue_arguments", [{}, {"x-queue-type": "quorum"}], ids=["classic", "quorum"]
)


@QUEUE_TYPES
def test_waiting_messages_are_taken_in_strict_order_of_preference(rabbit: Rabbit, queue_arguments) -> None:
    broker, q = rabbit.broker(queue_arguments=queue_arguments), rabbit.name()
    for job_id, priority in ((21, 2), (11, 1), (22, 2), (12, 1)):
        broker.publish(job_id, q, priority)
    broker.publish_die(q)
    consumer = rabbit.consumer(broker)
    taken = []
    while (delivery := consumer.take(q, [1, 2], timeout=0.2)) is not None:
        taken.append((delivery.body, delivery.priority))
        delivery.ack()
    assert taken == [("die", 0), ("11", 1), ("12", 1), ("21", 2), ("22", 2)]


def test_a_waiting_message_is_taken_even_with_timeout_zero(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    consumer = rabbit.consumer(broker)
    assert consumer.take(q, [1], timeout=0) is None
    broker.publish(3, q, 1)
    delivery = consumer.take(q, [1], timeout=0)
    assert delivery is not None
    assert delivery.body == "3"
    delivery.ack()


# --- ack and reject ---


def test_ack_removes_the_message_and_is_idempotent(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(3, q, 1)
    consumer = rabbit.consumer(broker)
    delivery = consumer.take(q, [1], timeout=2)
    assert delivery is not None
    delivery.ack()
    delivery.ack()
    delivery.reject()  # a no-op after ack
    assert rabbit.count(f"{q}_1") == 0
    assert consumer.take(q, [1], timeout=0.1) is None


def test_reject_returns_the_message_for_another_take(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(4, q, 1)
    consumer = rabbit.consumer(broker)
    delivery = consumer.take(q, [1], timeout=2)
    assert delivery is not None
    delivery.reject()
    delivery.reject()
    again = rabbit.consumer(broker).take(q, [1], timeout=2)
    assert again is not None
    assert again.body == "4"
    again.ack()


def test_an_unsettled_delivery_goes_back_at_the_next_take(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(5, q, 1)
    consumer = rabbit.consumer(broker)
    assert consumer.take(q, [1], timeout=2) is not None
    delivery = consumer.take(q, [1], timeout=2)
    assert delivery is not None
    assert delivery.body == "5"
    delivery.ack()


@QUEUE_TYPES
def test_an_unsettled_delivery_is_back_before_the_next_take_looks(rabbit: Rabbit, queue_arguments) -> None:
    """The nack goes first on the consumer's channel, so even a take() that does not wait finds it."""
    broker, q = rabbit.broker(queue_arguments=queue_arguments), rabbit.name()
    broker.publish(5, q, 1)
    broker.publish(6, q, 2)
    consumer = rabbit.consumer(broker)
    assert consumer.take(q, [1, 2], timeout=2) is not None
    delivery = consumer.take(q, [1, 2], timeout=0)
    assert delivery is not None
    assert delivery.body == "5"
    delivery.ack()


def test_the_other_prefetched_message_reaches_a_second_consumer(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(1, q, 1)
    broker.publish(2, q, 2)
    first = rabbit.consumer(broker).take(q, [1, 2], timeout=2)
    assert first is not None
    assert first.body == "1"
    # The first job is still running (not acked): the other message is already back in its queue.
    second = rabbit.consumer(broker).take(q, [1, 2], timeout=2)
    assert second is not None
    assert second.body == "2"
    first.ack()
    second.ack()
    assert rabbit.count(f"{q}_1") == rabbit.count(f"{q}_2") == 0


def test_ack_on_a_lost_connection_raises_and_the_message_comes_back(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(6, q, 1)
    consumer = rabbit.consumer(broker)
    delivery = consumer.take(q, [1], timeout=2)
    assert delivery is not None
    _kill_socket(consumer._connection)
    with pytest.raises(BrokerConnectionError, match="acknowledge"):
        delivery.ack()
    delivery.ack()  # settled: idempotent, no second error
    again = consumer.take(q, [1], timeout=2)
    assert again is not None
    assert again.body == "6"
    again.ack()


def test_reject_on_a_lost_connection_is_quiet_and_the_message_comes_back(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(8, q, 2)
    consumer = rabbit.consumer(broker)
    delivery = consumer.take(q, [2], timeout=2)
    assert delivery is not None
    _kill_socket(consumer._connection)
    delivery.reject()
    again = consumer.take(q, [2], timeout=None)
    assert again is not None
    assert (again.body, again.priority) == ("8", 2)
    again.ack()


# --- errors: unroutable, nack, confirm timeout, unreachable ---


def test_a_queue_deleted_behind_the_cache_is_declared_again(rabbit: Rabbit) -> None:
    """Decision: an unroutable message empties the declaration cache, re-declares and retries once."""
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(1, q, 1)
    channel = rabbit.channel()
    channel.queue_delete(f"{q}_1")
    assert not rabbit.exists(f"{q}_1")
    broker.publish(2, q, 1)
    assert rabbit.count(f"{q}_1") == 1


def test_a_message_that_stays_unroutable_raises_broker_error(rabbit: Rabbit, monkeypatch) -> None:
    broker, q = rabbit.broker(), rabbit.name()

    def exchange_only(self: _Topology, channel, qp: str, delay_ms=None) -> None:
        channel.exchange_declare(qp, exchange_type="direct", durable=True)

    monkeypatch.setattr(_Topology, "ensure", exchange_only)
    with pytest.raises(BrokerError, match="could not route") as raised:
        broker.publish(1, q, 1)
    assert not isinstance(raised.value, BrokerConnectionError)


def test_a_nacked_message_raises_broker_error(rabbit: Rabbit) -> None:
    broker, q = (
        rabbit.broker(queue_arguments={"x-max-length": 0, "x-overflow": "reject-publish"}),
        rabbit.name(),
    )
    with pytest.raises(BrokerError, match="nack"):
        broker.publish(1, q, 1)


def test_a_missing_confirm_raises_broker_error_and_the_next_publish_works(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(1, q, 1)
    broker._confirm_timeout = 1e-6  # expires before any confirm can be read
    with pytest.raises(BrokerError, match="did not confirm"):
        broker.publish(2, q, 1)
    broker._confirm_timeout = 10.0
    broker.publish(3, q, 1)
    assert rabbit.count(f"{q}_1") in (2, 3)  # the unconfirmed one may or may not have been stored


def test_an_unreachable_broker_raises_connection_error_quickly(rabbit: Rabbit) -> None:
    broker = rabbit.broker("amqp://guest:s3cret@127.0.0.1:1/")
    started = time.monotonic()
    with pytest.raises(BrokerConnectionError) as raised:
        broker.publish(1, "bgqt_unreachable", 1)
    assert "127.0.0.1:1" in str(raised.value)
    assert "s3cret" not in str(raised.value)
    with pytest.raises(BrokerConnectionError):
        rabbit.consumer(broker).take("bgqt_unreachable", [1], timeout=0.1)
    assert time.monotonic() - started < 2


def test_a_refused_declaration_is_a_broker_error(rabbit: Rabbit) -> None:
    q = rabbit.name()
    assert rabbit.declare_fails(f"{q}_1", {"x-max-length": 5}) is None
    broker = rabbit.broker()
    with pytest.raises(BrokerError, match="406") as raised:
        broker.publish(1, q, 1)
    assert not isinstance(raised.value, BrokerConnectionError)


# --- queue arguments ---


def test_per_queue_arguments_apply_to_queues_whose_name_contains_the_needle(rabbit: Rabbit) -> None:
    broker = rabbit.broker(per_queue_arguments={"transcribe": {"x-single-active-consumer": True}})
    transcribe, general = rabbit.name("_transcribe"), rabbit.name("_general")
    broker.publish(1, transcribe, 1)
    broker.publish(2, general, 1)
    single = {"x-single-active-consumer": True}
    assert rabbit.declare_fails(f"{transcribe}_1", single) is None
    assert rabbit.declare_fails(f"{transcribe}_1", None) == 406
    assert rabbit.declare_fails(f"{general}_1", None) is None
    assert rabbit.declare_fails(f"{general}_1", single) == 406


def test_queue_arguments_reach_every_queue_including_delay_queues(rabbit: Rabbit) -> None:
    q = rabbit.name()
    broker = rabbit.broker(  # the needle is this test's own '<q>_1': a bare '_1' may occur in the random name
        queue_arguments={"x-max-length": 1000},
        per_queue_arguments={f"{q}_1": {"x-single-active-consumer": True}},
    )
    rabbit.queues.add(f"{q}_1_500")
    broker.publish(1, q, 1, delay_ms=500)
    broker.publish_die(q)
    base = {"x-max-length": 1000, "x-single-active-consumer": True}
    dead_letter = {"x-dead-letter-exchange": f"{q}_1", "x-dead-letter-routing-key": f"{q}_1"}
    assert rabbit.declare_fails(f"{q}_1", base) is None
    assert rabbit.declare_fails(f"{q}_1_500", {**base, **dead_letter, "x-message-ttl": 500}) is None
    assert rabbit.declare_fails(f"{q}_0", {"x-max-length": 1000}) is None


def test_quorum_queues_carry_messages_and_delays(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(queue_arguments={"x-queue-type": "quorum"}), rabbit.name()
    rabbit.queues.add(f"{q}_1_300")
    broker.publish(1, q, 1, delay_ms=300)
    broker.publish(2, q, 2)
    consumer = rabbit.consumer(broker)
    delivery = consumer.take(q, [1, 2], timeout=2)
    assert delivery is not None
    assert delivery.body == "2"
    delivery.ack()
    delivery = consumer.take(q, [1, 2], timeout=3)
    assert delivery is not None
    assert delivery.body == "1"
    delivery.ack()
    assert rabbit.declare_fails(f"{q}_1", None) == 406  # it is not a classic queue


# --- the consumer's long-lived channel ---


def test_a_consumer_keeps_its_channel_and_declares_its_queues_once(rabbit: Rabbit, monkeypatch) -> None:
    declared: list[str] = []
    original = _Topology._queue

    def counting(self: _Topology, channel, name: str, exchange: str, arguments) -> None:
        declared.append(name)
        original(self, channel, name, exchange, arguments)

    monkeypatch.setattr(_Topology, "_queue", counting)
    broker, q = rabbit.broker(), rabbit.name()
    for job_id in (1, 2, 3):
        broker.publish(job_id, q, 1)
    declared.clear()  # the producer's own declarations
    consumer = rabbit.consumer(broker)
    delivery = consumer.take(q, [1, 2], timeout=2)
    assert delivery is not None
    channel = consumer._channel
    delivery.ack()
    for expected in ("2", "3"):
        delivery = consumer.take(q, [1, 2], timeout=2)
        assert delivery is not None
        assert delivery.body == expected
        delivery.ack()
    assert consumer.take(q, [1, 2], timeout=0.05) is None
    assert consumer._channel is channel
    assert sorted(declared) == [f"{q}_0", f"{q}_1", f"{q}_2"]


def test_a_consumer_holds_no_subscription_between_takes(rabbit: Rabbit) -> None:
    """Subscriptions exist only while take() waits on empty queues: nothing is held during a job."""
    broker, q = rabbit.broker(), rabbit.name()
    rabbit.queues.add(f"{q}_1_200")
    consumer = rabbit.consumer(broker)
    assert consumer.take(q, [1, 2], timeout=0.05) is None
    assert [rabbit.consumers(f"{q}_{p}") for p in (0, 1, 2)] == [0, 0, 0]
    broker.publish(1, q, 1, delay_ms=200)  # arrives while the next take waits
    delivery = consumer.take(q, [1, 2], timeout=3)
    assert delivery is not None
    assert delivery.body == "1"
    assert [rabbit.consumers(f"{q}_{p}") for p in (0, 1, 2)] == [0, 0, 0]
    broker.publish(2, q, 2)
    other = rabbit.consumer(broker).take(q, [1, 2], timeout=2)  # the first job is still running
    assert other is not None
    assert other.body == "2"
    delivery.ack()
    other.ack()


def test_a_queue_deleted_behind_the_consumers_cache_is_declared_again(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    consumer = rabbit.consumer(broker)
    assert consumer.take(q, [1], timeout=0.05) is None
    rabbit.channel().queue_delete(f"{q}_1")
    assert consumer.take(q, [1], timeout=0.05) is None  # basic.get: 404, then declared again
    assert rabbit.exists(f"{q}_1")
    broker.publish(4, q, 1)
    delivery = consumer.take(q, [1], timeout=2)
    assert delivery is not None
    assert delivery.body == "4"
    delivery.ack()


def test_a_closed_consumer_channel_is_reopened_at_the_next_take(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(5, q, 1)
    consumer = rabbit.consumer(broker)
    assert consumer.take(q, [2], timeout=0.05) is None
    consumer._channel.close()
    delivery = consumer.take(q, [1], timeout=2)
    assert delivery is not None
    assert delivery.body == "5"
    delivery.ack()


# --- reconnects and timeouts ---


def test_a_closed_producer_connection_is_reopened_on_the_next_publish(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(1, q, 1)
    broker._connection.close()
    broker.publish(2, q, 1)
    assert rabbit.count(f"{q}_1") == 2


def test_a_lost_producer_connection_is_reconnected_and_the_publish_retried(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(1, q, 1)
    lost = broker._connection
    _kill_socket(lost)
    broker.publish(2, q, 1)
    assert broker._connection is not lost
    assert rabbit.count(f"{q}_1") == 2


def test_close_then_publish_reconnects(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(1, q, 1)
    broker.close()
    broker.close()
    broker.publish(2, q, 1)
    assert rabbit.count(f"{q}_1") == 2


def test_a_lost_consumer_connection_is_replaced_at_the_next_take(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    consumer = rabbit.consumer(broker)
    assert consumer.take(q, [1], timeout=0.05) is None
    _kill_socket(consumer._connection)  # e.g. the broker dropped it while a long job ran
    broker.publish(1, q, 1)
    delivery = consumer.take(q, [1], timeout=2)
    assert delivery is not None
    assert delivery.body == "1"
    delivery.ack()
    consumer._connection.close()
    broker.publish(2, q, 1)
    delivery = consumer.take(q, [1], timeout=2)
    assert delivery is not None
    assert delivery.body == "2"
    delivery.ack()


def test_take_on_an_empty_queue_times_out(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    consumer = rabbit.consumer(broker)
    started = time.monotonic()
    assert consumer.take(q, [1, 2], timeout=0.2) is None
    assert 0.15 < time.monotonic() - started < 1.0


# --- pure functions ---


def test_connection_defaults_are_bounded_unless_the_url_sets_them() -> None:
    params = connection_parameters("amqp://guest:guest@127.0.0.1:5672/", "bgq test")
    assert params.heartbeat == 0
    assert params.connection_attempts == 1
    assert params.socket_timeout == 5.0
    assert params.blocked_connection_timeout == 60.0
    assert params.client_properties == {"connection_name": "bgq test"}
    params = connection_parameters("amqp://h/?heartbeat=30&socket_timeout=2", "bgq test")
    assert params.heartbeat == 30
    assert params.socket_timeout == 2


def test_redact_hides_the_password_only() -> None:
    assert redact("amqp://guest:guest@127.0.0.1:5672/vh") == "amqp://guest:***@127.0.0.1:5672/vh"
    assert redact("amqp://127.0.0.1/") == "amqp://127.0.0.1/"


def test_invalid_settings_are_config_errors() -> None:
    from bgq.broker.rabbitmq import RabbitMQ

    with pytest.raises(ConfigError):
        RabbitMQ(confirm_timeout=0)
    with pytest.raises(ConfigError):
        RabbitMQ("amqp://h/?heartbeat=abc")


def test_argument_needles_match_substrings() -> None:
    topology = _Topology({"x-queue-type": "quorum"}, {"transcribe": {"x-single-active-consumer": True}})
    assert topology.arguments_for("app_transcribe_1") == {
        "x-queue-type": "quorum",
        "x-single-active-consumer": True,
    }
    assert topology.arguments_for("app_general_1") == {"x-queue-type": "quorum"}


# --- take_batch: several messages at once (bgq consume's prefetch) ---


@QUEUE_TYPES
def test_take_batch_takes_up_to_its_limit_from_the_most_preferred_queue_only(
    rabbit: Rabbit, queue_arguments
) -> None:
    """A batch comes from one queue, the most preferred with messages waiting, in delivery order;
    what it did not take stays in the queues, and the next batches take it in order of preference."""
    broker, q = rabbit.broker(queue_arguments=queue_arguments), rabbit.name()
    for job_id in (21, 22):
        broker.publish(job_id, q, 2)
    for job_id in (11, 12, 13, 14, 15):
        broker.publish(job_id, q, 1)
    consumer = rabbit.consumer(broker)
    batches = []
    while batch := consumer.take_batch(q, [1, 2], 3, timeout=0.2):
        batches.append([(d.body, d.priority) for d in batch])
        if len(batches) == 1:
            assert rabbit.count_eventually(f"{q}_1", 2) == 2  # the rest stays for other consumers
            assert rabbit.count(f"{q}_2") == 2
        for delivery in batch:
            delivery.ack()
    assert batches == [
        [("11", 1), ("12", 1), ("13", 1)],
        [("14", 1), ("15", 1)],
        [("21", 2), ("22", 2)],
    ]
    assert [rabbit.consumers(f"{q}_{p}") for p in (0, 1, 2)] == [0, 0, 0]  # no subscription left


def test_take_batch_puts_the_control_queue_first(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    broker.publish(11, q, 1)
    broker.publish_die(q)
    batch = rabbit.consumer(broker).take_batch(q, [1], 10, timeout=2)
    assert [(d.body, d.priority) for d in batch] == [("die", 0)]
    batch[0].ack()
    assert rabbit.count_eventually(f"{q}_1", 1) == 1


def test_take_batch_on_empty_queues_waits_for_the_first_message(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    rabbit.queues.add(f"{q}_1_200")
    consumer = rabbit.consumer(broker)
    assert consumer.take_batch(q, [1], 10, timeout=0.05) == []
    broker.publish(7, q, 1, delay_ms=200)  # arrives while take_batch waits
    batch = consumer.take_batch(q, [1], 10, timeout=3)
    assert [d.body for d in batch] == ["7"]
    batch[0].ack()


def test_unsettled_messages_of_a_batch_go_back_at_the_next_take(rabbit: Rabbit) -> None:
    """A consumer holds nothing but what it handed out: a batch left unsettled is returned to its
    queue before the next take looks, so that take finds it again; a second consumer can take
    what the first one holds only once it is returned."""
    broker, q = rabbit.broker(), rabbit.name()
    for job_id in (1, 2, 3):
        broker.publish(job_id, q, 1)
    consumer = rabbit.consumer(broker)
    first = consumer.take_batch(q, [1], 2, timeout=2)
    assert [d.body for d in first] == ["1", "2"]
    first[0].ack()
    other = rabbit.consumer(broker).take_batch(q, [1], 5, timeout=0.5)
    assert [d.body for d in other] == ["3"]
    other[0].ack()
    again = consumer.take_batch(q, [1], 5, timeout=2)
    assert [d.body for d in again] == ["2"]
    again[0].ack()
    assert rabbit.count_eventually(f"{q}_1", 0) == 0


# --- the acks of a batch: one basic.ack(multiple) once every delivery of the take is settled ---


def _recording_acks(monkeypatch) -> list[tuple[int, bool]]:
    """Every basic.ack the consumers send, as (delivery tag, multiple)."""
    sent: list[tuple[int, bool]] = []
    original = BlockingChannel.basic_ack

    def recording(self, delivery_tag=0, multiple=False):
        sent.append((delivery_tag, multiple))
        return original(self, delivery_tag, multiple)

    monkeypatch.setattr(BlockingChannel, "basic_ack", recording)
    return sent


@QUEUE_TYPES
def test_the_acks_of_a_batch_go_out_as_one_once_the_last_is_settled(
    rabbit: Rabbit, queue_arguments, monkeypatch
) -> None:
    broker, q = rabbit.broker(queue_arguments=queue_arguments), rabbit.name()
    for job_id in (1, 2, 3, 4):
        broker.publish(job_id, q, 1)
    sent = _recording_acks(monkeypatch)
    consumer = rabbit.consumer(broker)
    batch = consumer.take_batch(q, [1], 4, timeout=2)
    assert [d.body for d in batch] == ["1", "2", "3", "4"]
    for delivery in batch[:3]:
        delivery.ack()
    assert sent == []  # noted, not sent: the batch is not settled yet
    batch[3].ack()
    assert sent == [(batch[3]._delivery_tag, True)]
    consumer.close()  # nothing unacknowledged is left to come back
    assert rabbit.count_eventually(f"{q}_1", 0, within=0.5) == 0


def test_a_rejected_message_of_a_batch_returns_and_the_acked_ones_do_not(rabbit: Rabbit, monkeypatch) -> None:
    """A reject goes out at once (another consumer may take the message while the batch is being
    settled); the acks of the others still go out together, and never cover the returned one."""
    broker, q = rabbit.broker(), rabbit.name()
    for job_id in (1, 2, 3):
        broker.publish(job_id, q, 1)
    sent = _recording_acks(monkeypatch)
    consumer = rabbit.consumer(broker)
    batch = consumer.take_batch(q, [1], 3, timeout=2)
    assert [d.body for d in batch] == ["1", "2", "3"]
    batch[0].ack()
    batch[1].reject()
    other = rabbit.consumer(broker).take_batch(q, [1], 3, timeout=2)
    assert [d.body for d in other] == ["2"]
    batch[2].ack()
    assert sent == [(batch[2]._delivery_tag, True)]
    consumer.close()
    assert rabbit.count_eventually(f"{q}_1", 0, within=0.5) == 0  # 1 and 3 are gone
    other[0].reject()
    assert rabbit.count_eventually(f"{q}_1", 1) == 1  # 2 was never covered by the ack


def test_acks_noted_before_the_next_take_or_close_are_sent_then(rabbit: Rabbit) -> None:
    """A batch left partly settled: the next take returns the unsettled messages and sends the
    acks (the acked messages are gone); close() sends the acks and returns the rest."""
    broker, q = rabbit.broker(), rabbit.name()
    for job_id in (1, 2, 3, 4):
        broker.publish(job_id, q, 1)
    consumer = rabbit.consumer(broker)
    first = consumer.take_batch(q, [1], 2, timeout=2)
    assert [d.body for d in first] == ["1", "2"]
    first[0].ack()
    second = consumer.take_batch(q, [1], 1, timeout=2)
    assert [d.body for d in second] == ["2"]
    second[0].ack()
    third = consumer.take_batch(q, [1], 2, timeout=2)
    assert [d.body for d in third] == ["3", "4"]
    third[1].ack()
    consumer.close()
    again = rabbit.consumer(broker).take_batch(q, [1], 5, timeout=2)
    assert [d.body for d in again] == ["3"]  # 1, 2 and 4 were acknowledged
    again[0].ack()


def test_the_last_ack_of_a_batch_on_a_lost_connection_raises_and_all_come_back(rabbit: Rabbit) -> None:
    broker, q = rabbit.broker(), rabbit.name()
    for job_id in (1, 2):
        broker.publish(job_id, q, 1)
    consumer = rabbit.consumer(broker)
    batch = consumer.take_batch(q, [1], 2, timeout=2)
    assert [d.body for d in batch] == ["1", "2"]
    batch[0].ack()
    _kill_socket(consumer._connection)
    with pytest.raises(BrokerConnectionError, match="acknowledge 2 message"):
        batch[1].ack()
    batch[1].ack()  # settled: idempotent, no second error
    again = consumer.take_batch(q, [1], 5, timeout=2)
    assert sorted(d.body for d in again) == ["1", "2"]
    for delivery in again:
        delivery.ack()
