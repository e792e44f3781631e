"""The RabbitMQ broker (pika BlockingConnection): confirmed publishes of ids, taken singly or in batches.

One server or a cluster: `RabbitMQ(url)` or `RabbitMQ([url1, url2, url3])` (or one string of URLs
separated by spaces). Each connection goes to one node; when it is lost, the next connection tries
the next node first (see _Nodes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import pika
from pika import exceptions as pe
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from ..errors import ConfigError
from . import CONTROL_PRIORITY, DIE, BrokerConnectionError, BrokerError, queue_with_priority

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"

log = logging.getLogger("bgq.broker")

# Connection settings used unless the URL's query string sets them ('?heartbeat=30&socket_timeout=3').
# heartbeat=0: pika's BlockingConnection answers heartbeats only while the application is inside a
# pika call. A worker runs its job between two take() calls and a web app idles between two publishes,
# so with heartbeats on, the broker would drop the connection after two missed beats of any long job
# (and the ack that follows a long job would fail). Off, the connection survives; a dead peer is found
# by TCP keepalive (idle reads) and TCP_USER_TIMEOUT (unacknowledged writes) instead, and a connection
# that did die in between is replaced before the next publish/take anyway.
_CONNECTION_DEFAULTS: dict[str, Any] = {
    "heartbeat": 0,
    "connection_attempts": 1,
    "socket_timeout": 5.0,  # TCP connect
    "stack_timeout": 10.0,  # whole connection set-up (TCP + AMQP handshake)
    "blocked_connection_timeout": 60.0,  # broker resource alarm: give up instead of waiting for ever
    "tcp_options": {"TCP_KEEPIDLE": 60, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 6, "TCP_USER_TIMEOUT": 30_000},
}

# A lost connection or channel: worth one reconnect.
_LOST = (pe.AMQPConnectionError, pe.ChannelClosed, pe.ChannelWrongStateError, OSError)

#: publish(): the pause before the one retry of a message the broker nacked.
NACK_PAUSE_SECONDS = 1.0

#: take_batch(): a subscription that delivered nothing for this long has given what it will give.
GAP_SECONDS = 0.02

_PROPERTIES = pika.BasicProperties(content_type="text/plain", delivery_mode=pika.DeliveryMode.Persistent)


def redact(url: str) -> str:
    """The URL with its password replaced by '***' (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def parse_urls(url_or_urls: str | Sequence[str]) -> list[str]:
    """The AMQP URLs of `url_or_urls`: one URL, several in one string separated by whitespace (a URL
    has no whitespace), or a sequence of them; in the order given, duplicates dropped. ConfigError
    when there is none or one is not an amqp:// or amqps:// URL."""
    items = [url_or_urls] if isinstance(url_or_urls, str) else list(url_or_urls)
    urls: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"A RabbitMQ URL must be a str, not {type(item).__name__}: {item!r}")
        urls += item.split()
    if not urls:
        raise ConfigError("No RabbitMQ URL given (an empty string or list).")
    for url in urls:
        if urlsplit(url).scheme not in ("amqp", "amqps"):
            raise ConfigError(f"Invalid RabbitMQ URL {redact(url)}: it must start with amqp:// or amqps://")
    return list(dict.fromkeys(urls))


#: The orders in which a process tries the nodes of a URL list (RabbitMQ(url_order=...)).
URL_ORDERS = ("random", "given")


class _Nodes:
    """The nodes one connection user (the producer, or one consumer) may connect to, and the order
    in which it tries them.

    The first node tried is the one the last connection used, or after that connection was lost,
    the next one in the list; then the others in list order, cyclically. A connection that was
    lost is most often a node that died, whose port refuses at once or whose connect times out
    (socket_timeout): starting from the next node costs nothing when the old one is back.

    Where a process starts: url_order="random" (the default) picks the first node at random, once
    per process (a forked child picks its own), so that a fleet of consumers spreads over the
    cluster's nodes and a node that dies takes only its share of them; "given" starts every process
    at the first URL (e.g. a preferred node, with the others as stand-bys).
    """

    def __init__(self, urls: Sequence[str], connection_name: str, order: str) -> None:
        self.urls = list(urls)
        self.parameters = [connection_parameters(url, connection_name) for url in self.urls]
        self.order = order
        self._next: int | None = None  # the index tried first by the next connect()
        self._pid = 0
        self.current: int | None = None  # the index of the last connection's node
        self._lost: tuple[str, str] | None = None  # (URL, why) of the last connection lost

    @property
    def url(self) -> str:
        """The URL of the node in use (or tried first next)."""
        return self.urls[self.current if self.current is not None else (self._next or 0)]

    def attempt_order(self) -> list[int]:
        """The indexes of the URLs in the order the next connect() tries them."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self.current = None
            self._next = random.randrange(len(self.urls)) if self.order == "random" else 0
        start = self._next or 0
        return [(start + i) % len(self.urls) for i in range(len(self.urls))]

    def connect(self) -> BlockingConnection:
        """A connection to the first node that accepts one, in attempt_order(); when none does,
        BrokerConnectionError naming each node and why."""
        errors: list[str] = []
        for index in self.attempt_order():
            try:
                connection = pika.BlockingConnection(self.parameters[index])
            except (pe.AMQPError, OSError) as exc:  # its str() is often empty; the repr names it
                errors.append(f"{redact(self.urls[index])} ({exc!r})")
                continue
            self.current = self._next = index
            if self._lost is not None:
                lost_url, why = self._lost
                self._lost = None
                log.warning(
                    f"bgq: Lost the RabbitMQ connection to {redact(lost_url)} ({why}); "
                    f"reconnected to {redact(self.urls[index])}."
                )
            return connection
        self.current = None
        self._lost = None  # the caller reports the error below
        if len(errors) == 1:
            raise BrokerConnectionError(f"RabbitMQ is not reachable at {errors[0]}")
        raise BrokerConnectionError(
            f"RabbitMQ is not reachable at any of its {len(errors)} nodes: " + ", ".join(errors)
        )

    def lost(self, why: str = "") -> None:
        """The connection in use was lost (`why`): the next connect() tries the next node first,
        and logs a warning naming both once it connected."""
        if self.current is not None:
            self._lost = (self.urls[self.current], why)
            self._next = (self.current + 1) % len(self.urls)
            self.current = None


#: Arguments a quorum queue refuses (406 PRECONDITION_FAILED - invalid arg ...), and why.
_QUORUM_REFUSES = {
    "x-max-priority": "quorum queues have no message priorities (bgq uses one queue per priority instead)",
    "x-queue-mode": "quorum queues have no lazy mode (they keep messages on disk anyway)",
    "x-queue-master-locator": "use x-queue-leader-locator",
    "x-queue-version": "a classic queue setting",
    "x-max-age": "a stream setting",
}


def _check_quorum(arguments: Mapping[str, Any], where: str) -> None:
    if arguments.get("x-queue-type") != "quorum":
        return
    for key, why in _QUORUM_REFUSES.items():
        if key in arguments:
            raise ConfigError(f"{where} sets {key!r}, which a quorum queue refuses: {why}.")


_QUEUE_IN_REPLY = re.compile(r"for queue '([^']*)'")


def refusal(reply_code: int, reply_text: str) -> str:
    """The broker's refusal of a declaration, with what to do about it when it is a known one."""
    text = f"{reply_code} {reply_text}"
    found = _QUEUE_IN_REPLY.search(reply_text)
    name = found.group(1) if found else "<queue>"
    if reply_code == 406 and "inequivalent arg 'x-queue-type'" in reply_text:
        return (
            f"{text}. The queue {name!r} exists with another type than bgq declares (a queue's type "
            f"never changes): drain it, delete it (rabbitmqctl delete_queue {name}) and let bgq "
            "declare it again, or configure bgq with the queue's type (queue_type=...)."
        )
    if reply_code == 406 and "inequivalent arg" in reply_text:
        return (
            f"{text}. The queue {name!r} exists with other arguments than bgq declares: drain it and "
            f"delete it (rabbitmqctl delete_queue {name}), or configure the arguments it has."
        )
    return text


def connection_parameters(url: str, connection_name: str) -> pika.URLParameters:
    """pika parameters for `url`, with bgq's bounded defaults for every setting the URL leaves out."""
    try:
        params = pika.URLParameters(url)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"Invalid RabbitMQ URL {redact(url)}: {exc}") from None
    given = parse_qs(urlsplit(url).query)
    for key, value in _CONNECTION_DEFAULTS.items():
        if key not in given:
            setattr(params, key, value)
    if "client_properties" not in given:
        params.client_properties = {"connection_name": connection_name}
    return params


def _ioloop_timer(
    connection: BlockingConnection, delay: float, callback: Callable[[], None]
) -> Callable[[], None]:
    """Call `callback` after `delay` seconds from inside whatever the connection is waiting on;
    return what cancels it. The one place bgq touches pika's private API, on purpose: the public
    BlockingConnection.call_later fires only in process_data_events, never while basic_publish
    waits for a publisher confirm, which is the wait this bounds. The adapter timer of the
    underlying connection (`_impl._adapter_call_later`, `_adapter_remove_timeout`) is the
    mechanism pika's own process_data_events(time_limit) uses; tests/test_private_apis.py fails
    loudly the day pika renames it."""
    impl = connection._impl
    timer = impl._adapter_call_later(delay, callback)
    return lambda: impl._adapter_remove_timeout(timer)


class _ConfirmTimeout(Exception):
    """The broker did not confirm a message within confirm_timeout."""


class _Topology:
    """Declares exchanges and queues with the configured arguments, once per name (a cache)."""

    def __init__(
        self,
        queue_arguments: Mapping[str, Any],
        per_queue_arguments: Mapping[str, Mapping[str, Any]],
        *,
        delay_at_least_once: bool = False,
    ) -> None:
        self.queue_arguments = dict(queue_arguments)
        self.per_queue_arguments = {needle: dict(args) for needle, args in per_queue_arguments.items()}
        # Quorum delay queues dead-letter at-least-once (the expired message stays in the delay
        # queue until its target queue confirmed it), instead of RabbitMQ's at-most-once default.
        self.delay_at_least_once = delay_at_least_once
        self.declared: set[str] = set()
        self.quorum: dict[str, bool] = {}
        _check_quorum(self.queue_arguments, "queue_arguments")
        for needle, extra in self.per_queue_arguments.items():
            _check_quorum({**self.queue_arguments, **extra}, f"per_queue_arguments[{needle!r}]")

    def copy(self) -> _Topology:
        """The same arguments with an empty cache (each connection user keeps its own)."""
        return _Topology(
            self.queue_arguments, self.per_queue_arguments, delay_at_least_once=self.delay_at_least_once
        )

    def is_quorum(self, name: str) -> bool:
        """Whether queue `name` is declared as a quorum queue (cached: the arguments never change)."""
        quorum = self.quorum.get(name)
        if quorum is None:
            quorum = self.quorum[name] = self.arguments_for(name).get("x-queue-type") == "quorum"
        return quorum

    def arguments_for(self, name: str) -> dict[str, Any]:
        arguments = dict(self.queue_arguments)
        for needle, extra in self.per_queue_arguments.items():
            if needle in name:
                arguments.update(extra)
        return arguments

    def ensure(self, channel: BlockingChannel, qp: str, delay_ms: int | None = None) -> None:
        """Exchange `qp`, queue `qp` bound with key `qp`, and with `delay_ms` the TTL queue '<qp>_<ms>'."""
        if qp not in self.declared:
            channel.exchange_declare(qp, exchange_type="direct", durable=True, auto_delete=False)
            self._queue(channel, qp, qp, self.arguments_for(qp))
            self.declared.add(qp)
        if delay_ms:
            delay_queue = f"{qp}_{delay_ms}"
            if delay_queue not in self.declared:
                arguments = self.arguments_for(delay_queue)
                arguments.update(
                    {"x-dead-letter-exchange": qp, "x-dead-letter-routing-key": qp, "x-message-ttl": delay_ms}
                )
                if self.delay_at_least_once and arguments.get("x-queue-type") == "quorum":
                    # at-least-once dead-lettering needs x-overflow reject-publish (RabbitMQ 3.10+)
                    arguments.setdefault("x-dead-letter-strategy", "at-least-once")
                    arguments.setdefault("x-overflow", "reject-publish")
                self._queue(channel, delay_queue, qp, arguments)
                self.declared.add(delay_queue)

    def _queue(self, channel: BlockingChannel, name: str, exchange: str, arguments: dict[str, Any]) -> None:
        channel.queue_declare(name, durable=True, exclusive=False, auto_delete=False, arguments=arguments)
        channel.queue_bind(name, exchange, routing_key=name)

    def forget(self) -> None:
        self.declared.clear()


def _close_quietly(resource: BlockingConnection | BlockingChannel | None) -> None:
    if resource is None:
        return
    try:
        if resource.is_open:
            resource.close()
    except Exception:  # it is going away either way; a dead socket may raise anything here
        pass


class RabbitMQ:
    """Producer and consumer factory on one RabbitMQ server or cluster (a bgq Broker).

    `url`: one AMQP URL, or the URLs of a cluster's nodes (a sequence, or one string of URLs
    separated by spaces); each connection uses one node and moves to another when it is lost (the
    order: `url_order`, see _Nodes). Every queue and exchange is durable; a message is persistent,
    published mandatory on a channel in confirm mode, so publish() returns only once the broker
    stored it in a queue. `queue_type="quorum"` makes every queue bgq declares a quorum queue (the
    priority, control and delay queues; delay queues then dead-letter at-least-once);
    `queue_arguments` apply to every queue, `per_queue_arguments[needle]` to every queue whose
    name contains `needle`.

    Failure handling of publish(): a lost connection or channel is closed, reconnected and the publish
    retried once (on the next node of a cluster), then BrokerConnectionError. A nack is retried
    once after NACK_PAUSE_SECONDS (a quorum queue electing a new leader), then BrokerError. An
    unroutable message (its queue was deleted behind the
    declaration cache, e.g. by an admin or a broker reset) empties the cache, re-declares and retries
    once, then BrokerError. No confirm within `confirm_timeout` seconds is a BrokerError at once
    (the connection is replaced, on the next node). A retry after an unconfirmed attempt may
    deliver an id twice; bgq's claim is exactly-once, so that is harmless.

    One instance may be shared by threads (publish is serialised by a lock); a forked child opens its
    own connection. Consumers from consumer() have their own connection and belong to one thread.
    """

    def __init__(
        self,
        url: str | Sequence[str] = DEFAULT_URL,
        *,
        queue_type: str | None = None,
        queue_arguments: dict[str, Any] | None = None,
        per_queue_arguments: dict[str, dict[str, Any]] | None = None,
        confirm_timeout: float = 10.0,
        url_order: str = "random",
    ) -> None:
        if isinstance(confirm_timeout, bool) or not (
            isinstance(confirm_timeout, int | float) and confirm_timeout > 0
        ):
            raise ConfigError(
                f"confirm_timeout must be a positive number of seconds, not {confirm_timeout!r}"
            )
        if queue_type not in (None, "classic", "quorum"):
            raise ConfigError(f"queue_type must be 'quorum', 'classic' or None, not {queue_type!r}")
        if url_order not in URL_ORDERS:
            raise ConfigError(f"url_order must be one of {', '.join(URL_ORDERS)}, not {url_order!r}")
        self.urls = parse_urls(url)
        self.url_order = url_order
        self._nodes = _Nodes(self.urls, "bgq producer", url_order)
        arguments = dict(queue_arguments or {})
        if queue_type is not None:
            given = arguments.get("x-queue-type", queue_type)
            if given != queue_type:
                raise ConfigError(
                    f"queue_type={queue_type!r} contradicts queue_arguments x-queue-type={given!r}"
                )
            arguments["x-queue-type"] = queue_type
        self.queue_type = queue_type
        self._topology = _Topology(
            arguments, per_queue_arguments or {}, delay_at_least_once=queue_type == "quorum"
        )
        self._confirm_timeout = float(confirm_timeout)
        self._connection: BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """The URL of the node the producer uses (or tries first)."""
        return self._nodes.url

    def __repr__(self) -> str:
        shown = [redact(u) for u in self.urls]
        return f"RabbitMQ({shown[0]!r})" if len(shown) == 1 else f"RabbitMQ({shown!r})"

    # --- Producer ---

    def publish(self, job_id: int, queue: str, priority: int, delay_ms: int | None = None) -> None:
        if priority == CONTROL_PRIORITY:
            raise BrokerError(
                f"Priority {CONTROL_PRIORITY} is the control queue '{queue}_0'; jobs need 1 or more."
            )
        qp = queue_with_priority(queue, priority)
        delay = int(delay_ms) if delay_ms is not None and delay_ms > 0 else None
        self._send(qp, f"{qp}_{delay}" if delay else qp, str(job_id), delay)

    def publish_die(self, queue: str) -> None:
        qp = queue_with_priority(queue, CONTROL_PRIORITY)
        self._send(qp, qp, DIE, None)

    def close(self) -> None:
        with self._lock:
            self._drop()

    def consumer(self) -> RabbitConsumer:
        return RabbitConsumer(self.urls, self._topology.copy(), url_order=self.url_order)

    # --- internals ---

    def _send(self, qp: str, routing_key: str, body: str, delay_ms: int | None) -> None:
        with self._lock:
            failure: BrokerError | None = None
            for attempt in range(2):
                try:
                    channel = self._ensure_channel()
                    self._topology.ensure(channel, qp, delay_ms)
                    self._publish_confirmed(channel, qp, routing_key, body)
                    return
                except _ConfirmTimeout:  # e.g. a node cut off from its cluster's majority
                    self._nodes.lost(f"no confirm within {self._confirm_timeout:g} s")
                    self._drop()
                    raise BrokerError(
                        f"RabbitMQ did not confirm message {body!r} to {routing_key!r} "
                        f"within {self._confirm_timeout:g} s."
                    ) from None
                except pe.NackError:
                    # A quorum queue whose leader just died nacks what it had not committed yet;
                    # its new leader is elected within about a second. One more try after a
                    # pause (a full queue with reject-publish nacks again, and that is final).
                    failure = BrokerError(
                        f"RabbitMQ refused message {body!r} to {routing_key!r} (basic.nack, twice "
                        f"{NACK_PAUSE_SECONDS:g} s apart)."
                    )
                    if attempt == 0:
                        time.sleep(NACK_PAUSE_SECONDS)
                except pe.UnroutableError as exc:
                    returned = exc.messages[0].method if exc.messages else None
                    detail = f"{returned.reply_code} {returned.reply_text}" if returned else "returned"
                    failure = BrokerError(
                        f"RabbitMQ could not route message {body!r} to {routing_key!r} ({detail})."
                    )
                    self._topology.forget()
                except pe.ChannelClosedByBroker as exc:
                    failure = BrokerError(
                        f"RabbitMQ closed the channel while publishing to {routing_key!r}: "
                        f"{refusal(exc.reply_code, exc.reply_text)}"
                    )
                    self._channel = None
                    self._topology.forget()
                except _LOST as exc:
                    failure = BrokerConnectionError(
                        f"RabbitMQ at {redact(self.url)} is not reachable: {exc!r}"
                    )
                    self._nodes.lost(repr(exc))
                    self._drop()
                    self._topology.forget()
                except pe.AMQPError as exc:  # a protocol error: the connection is not to be trusted
                    self._drop()
                    raise BrokerError(f"RabbitMQ failed to publish to {routing_key!r}: {exc!r}") from None
            assert failure is not None
            raise failure

    def _ensure_channel(self) -> BlockingChannel:
        if self._pid != os.getpid():
            # A forked child shares the parent's socket: abandon it without closing it (a close
            # would end the parent's connection too) and open our own.
            self._connection, self._channel, self._pid = None, None, os.getpid()
        if self._connection is None or not self._connection.is_open:
            self._drop()
            self._connection = self._nodes.connect()
        if self._channel is None or not self._channel.is_open:
            self._channel = self._connection.channel()
            self._channel.confirm_delivery()
        return self._channel

    def _publish_confirmed(
        self, channel: BlockingChannel, exchange: str, routing_key: str, body: str
    ) -> None:
        """basic_publish, bounded by confirm_timeout.

        BlockingChannel.basic_publish waits for the confirm with no limit of its own; the bound is
        an ioloop timer (_ioloop_timer), which raises out of the wait, and the caller then throws
        the connection away.
        """
        connection = channel.connection
        fired = False

        def expire() -> None:
            nonlocal fired
            fired = True
            raise _ConfirmTimeout()

        cancel = _ioloop_timer(connection, self._confirm_timeout, expire)
        try:
            channel.basic_publish(
                exchange, routing_key, body.encode(), properties=_PROPERTIES, mandatory=True
            )
        finally:
            if not fired and not connection.is_closed:
                cancel()

    def _drop(self) -> None:
        channel, connection = self._channel, self._connection
        self._channel = self._connection = None
        _close_quietly(channel)
        _close_quietly(connection)


class _Settlement:
    """The deliveries of one take on one channel: their acks go out together, as one
    basic.ack(multiple) once every delivery of the take is settled.

    multiple=True acknowledges every unacknowledged delivery of the channel up to the tag given.
    When the last delivery of a take is settled, the only unacknowledged deliveries of the channel
    are the ones ack()ed since: the others of the take were returned (basic.nack, sent at once and
    handled before the ack), and a take returns only after it gave back every delivery it did not
    hand out (the subscription's cancel returns the undispatched ones; _wait nacks the extras);
    an earlier take's deliveries were all settled, and their acks sent, before this take looked.
    """

    __slots__ = ("acked", "channel", "unsettled")

    def __init__(self, channel: BlockingChannel, size: int) -> None:
        self.channel = channel
        self.unsettled = size  # deliveries of the take neither acked nor rejected yet
        self.acked: list[int] = []  # delivery tags acked by the caller, not yet sent

    def settled_one(self, *, raising: bool) -> None:
        """One more delivery is settled; send the acks once all are (BrokerConnectionError if
        that fails and `raising`, else quiet)."""
        self.unsettled -= 1
        if self.unsettled > 0 or not self.acked:
            return
        tags, self.acked = self.acked, []
        try:
            if len(tags) == 1:
                self.channel.basic_ack(tags[0])
            else:
                self.channel.basic_ack(max(tags), multiple=True)
        except (pe.AMQPError, OSError) as exc:
            _close_quietly(self.channel)
            if raising:
                raise BrokerConnectionError(
                    f"Could not acknowledge {len(tags)} message(s) ({exc!r}); RabbitMQ will deliver "
                    "them again."
                ) from None

    def flush_alone(self) -> None:
        """Send the acks gathered so far one by one (multiple=False leaves the unsettled
        deliveries alone); quiet: used when the consumer closes."""
        tags, self.acked = self.acked, []
        with contextlib.suppress(pe.AMQPError, OSError):
            for tag in tags:
                self.channel.basic_ack(tag)


class RabbitDelivery:
    """One message from RabbitConsumer.take(): ack() or reject() it on the consumer's channel."""

    def __init__(
        self, settlement: _Settlement, delivery_tag: int, body: str, priority: int, queue: str
    ) -> None:
        self.body = body
        self.priority = priority
        self.queue = queue  # the name of the queue it came from
        self._settlement = settlement
        self._delivery_tag = delivery_tag
        self._settled = False

    def __repr__(self) -> str:
        return f"RabbitDelivery(body={self.body!r}, priority={self.priority})"

    @property
    def settled(self) -> bool:
        """Whether ack() or reject() was called."""
        return self._settled

    def ack(self) -> None:
        """Acknowledge; BrokerConnectionError if the channel is gone (the broker then delivers the
        message again, which bgq's exactly-once claim makes harmless).

        The deliveries of one take are acknowledged together: the ack() (or reject()) that settles
        the last of them sends one basic.ack(multiple) for all those acked, and raises if that
        fails; an earlier ack() only notes its delivery (a consumer that closes sends what was
        noted; one that dies has its deliveries redelivered, which the claim makes harmless, as
        above). basic.ack has no reply: it is written to the socket, and the broker handles it
        before any later command of this channel (the next take's basic.get included).
        """
        if self._settled:
            return
        self._settled = True
        self._settlement.acked.append(self._delivery_tag)
        self._settlement.settled_one(raising=True)

    def reject(self) -> None:
        """Return the message to its queue.

        basic.nack(requeue) rather than basic.reject: from RabbitMQ 4.3 a reject counts as a failed
        delivery towards a quorum queue's delivery-limit (default 20, then the message is dropped),
        a nack does not. A lost channel returns the message as well, so errors are ignored.
        """
        if self._settled:
            return
        self._settled = True
        settlement = self._settlement
        with contextlib.suppress(pe.AMQPError, OSError):
            settlement.channel.basic_nack(self._delivery_tag, requeue=True)
        settlement.settled_one(raising=False)


class RabbitConsumer:
    """Takes messages from '<queue>_0' and '<queue>_<p>', on a connection of its own.

    The connection and its channel live as long as the consumer: queues are declared once (a cache,
    emptied after an error), and a take() with messages waiting is one basic.get per queue, in order
    of preference, until one returns a message (a quorum queue is asked for its message count
    first). take_batch() asks each queue for its count, in order of preference, and takes up to
    `limit` messages from the first that has any through a subscription of its own (prefetch =
    what it takes), cancelled before it returns. Only when every queue is empty does either
    subscribe to all of them (prefetch 1 each) and wait for the first delivery; it cancels those
    subscriptions before it returns, so a consumer never holds a message other than those it
    handed out.
    """

    def __init__(self, url: str | Sequence[str], topology: _Topology, *, url_order: str = "random") -> None:
        self.urls = parse_urls(url)
        self._nodes = _Nodes(self.urls, "bgq consumer", url_order)
        self._topology = topology
        self._connection: BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._handed: list[RabbitDelivery] = []  # the last ones handed out
        self._waiting: set[str] = set()  # queues whose last basic.get-ok counted more messages
        self._prefetch = 0  # the channel's basic.qos prefetch_count (0: not set yet)
        self._pid = os.getpid()

    @property
    def url(self) -> str:
        """The URL of the node the consumer uses (or tries first)."""
        return self._nodes.url

    def __repr__(self) -> str:
        return f"RabbitConsumer({redact(self.url)!r})"

    def take(
        self, queue: str, priorities: Sequence[int], timeout: float | None = None
    ) -> RabbitDelivery | None:
        deliveries = self._take(queue, priorities, 1, timeout)
        return deliveries[0] if deliveries else None

    def take_batch(
        self, queue: str, priorities: Sequence[int], limit: int, timeout: float | None = None
    ) -> list[RabbitDelivery]:
        """Up to `limit` messages, all from one queue: the first in the order of preference of
        take() ('<queue>_0', then each priority in the order given) that has messages waiting,
        in the order it delivered them. When every queue is empty, waits up to `timeout` (None:
        for ever) for the first message as take() does, and returns it with any message of the
        same queue that arrived together ([] on timeout). The consumer holds no message besides
        those it returned; one neither ack()ed nor reject()ed goes back to its queue at the next
        take() or take_batch()."""
        return self._take(queue, priorities, max(1, limit), timeout)

    def _take(
        self, queue: str, priorities: Sequence[int], limit: int, timeout: float | None
    ) -> list[RabbitDelivery]:
        self._abandon_if_forked()
        # Deliveries left unsettled by the caller go back to their queue now (before the
        # basic.get below on the same channel, so this take may return them again).
        for delivery in self._handed:
            if not delivery.settled:
                delivery.reject()
                self._waiting.add(delivery.queue)
        self._handed = []
        wanted = [CONTROL_PRIORITY, *(p for p in priorities if p != CONTROL_PRIORITY)]
        wanted = list(dict.fromkeys(wanted))
        names = [queue_with_priority(queue, p) for p in wanted]
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)

        failure: BrokerError | None = None
        for _attempt in range(2):
            try:
                channel = self._ensure_channel()
                for name in names:
                    self._topology.ensure(channel, name)
                found = (
                    self._get_first(channel, names) if limit == 1 else self._get_many(channel, names, limit)
                )
                if not found:
                    first = self._wait(channel, names, deadline)
                    found = [] if first is None else [first]
                break
            except pe.ChannelClosedByBroker as exc:
                failure = BrokerError(
                    f"RabbitMQ refused to consume {names}: {refusal(exc.reply_code, exc.reply_text)}"
                )
                self._topology.forget()
                self._drop_channel()
            except _LOST as exc:
                # Unacknowledged deliveries return to their queues with the channel/connection.
                failure = BrokerConnectionError(
                    f"Lost RabbitMQ at {redact(self.url)} while waiting for a message: {exc!r}"
                    if self._connection is not None
                    else f"RabbitMQ at {redact(self.url)} is not reachable: {exc!r}"
                )
                self._nodes.lost(repr(exc))
                self._reset()
            except pe.AMQPError as exc:  # a protocol error: the connection is not to be trusted
                self._reset()
                raise BrokerError(f"RabbitMQ failed to consume {names}: {exc!r}") from None
            except BaseException:
                # Interrupted (e.g. KeyboardInterrupt) inside a pika call or while subscribed: the
                # channel's state is unknown, so start afresh; what it held goes back to its queues.
                self._reset()
                raise
        else:
            assert failure is not None
            raise failure
        settlement = _Settlement(channel, len(found))
        self._handed = [
            RabbitDelivery(settlement, tag, body.decode("utf-8", "replace"), wanted[index], names[index])
            for index, tag, body in found
        ]
        return list(self._handed)

    def close(self) -> None:
        """Close the connection; an unsettled delivery goes back to its queue (the acks of the
        others are sent first)."""
        self._abandon_if_forked()
        if self._handed:
            self._handed[0]._settlement.flush_alone()
        self._handed = []
        self._drop_channel()
        connection, self._connection = self._connection, None
        _close_quietly(connection)

    # --- internals ---

    def _get_first(self, channel: BlockingChannel, names: list[str]) -> list[tuple[int, int, bytes]]:
        """basic.get on each queue in order: [(index in `names`, delivery tag, body)] of the first
        message ([]: none).

        On a quorum queue every basic.get, an empty one too, is a command through the Raft log (about
        three times the cost of a passive queue.declare, which reads the leader's message count). So a
        quorum queue is first asked for its count, unless its last basic.get said more were waiting.
        """
        for index, name in enumerate(names):
            probe = self._topology.is_quorum(name) and name not in self._waiting
            if probe and channel.queue_declare(name, passive=True).method.message_count == 0:
                continue
            method, _properties, body = channel.basic_get(name, auto_ack=False)
            if method is None or not method.message_count:
                self._waiting.discard(name)
            else:
                self._waiting.add(name)
            if method is not None:
                return [(index, method.delivery_tag, body or b"")]
        return []

    def _get_many(
        self, channel: BlockingChannel, names: list[str], limit: int
    ) -> list[tuple[int, int, bytes]]:
        """Up to `limit` messages of the first queue in `names` that has messages waiting (a
        passive queue.declare reads each count): a subscription with prefetch = what it takes,
        cancelled once that many arrived or none came for GAP_SECONDS (another consumer took
        the rest). One message is a basic.get. Deliveries pika has not dispatched yet when the
        subscription is cancelled go back to the queue (pika rejects them with requeue)."""
        for index, name in enumerate(names):
            count = channel.queue_declare(name, passive=True).method.message_count
            if count == 0:
                continue
            want = min(limit, count)
            if want == 1:
                method, _properties, body = channel.basic_get(name, auto_ack=False)
                if method is None:
                    continue
                return [(index, method.delivery_tag, body or b"")]
            arrived: list[tuple[int, int, bytes]] = []

            def on_message(
                _ch: Any, method: Any, _props: Any, body: bytes, index: int = index,
                arrived: list[tuple[int, int, bytes]] = arrived,
            ) -> None:  # fmt: skip
                arrived.append((index, method.delivery_tag, body or b""))

            self._qos(channel, want)
            tag = channel.basic_consume(name, on_message, auto_ack=False)
            connection = channel.connection
            last = time.monotonic()
            while len(arrived) < want:
                before = len(arrived)
                connection.process_data_events(time_limit=GAP_SECONDS)
                now = time.monotonic()
                if len(arrived) > before:
                    last = now
                elif now - last >= GAP_SECONDS:
                    break
            channel.basic_cancel(tag)
            if arrived:
                return arrived
        return []

    def _wait(
        self, channel: BlockingChannel, names: list[str], deadline: float | None
    ) -> tuple[int, int, bytes] | None:
        """Subscribe to every queue until the first delivery or the deadline; cancel; keep the best.

        When several queues delivered together, the most preferred message is kept and the others go
        back to their queues at once (other consumers want them, not after this job).
        """
        if deadline is not None and time.monotonic() >= deadline:
            return None
        arrived: list[tuple[int, int, bytes]] = []
        tags = []
        self._qos(channel, 1)  # one message per subscription
        for index, name in enumerate(names):

            def on_message(_ch: Any, method: Any, _props: Any, body: bytes, index: int = index) -> None:
                arrived.append((index, method.delivery_tag, body or b""))

            tags.append(channel.basic_consume(name, on_message, auto_ack=False))
        connection = channel.connection
        while not arrived:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            connection.process_data_events(time_limit=remaining)
        if arrived:
            connection.process_data_events(time_limit=0)  # collect what arrived together
        for tag in tags:
            # pika returns (basic.reject, requeue) any delivery that was not dispatched to us yet.
            channel.basic_cancel(tag)
        if not arrived:
            return None
        arrived.sort()
        for _index, other_tag, _body in arrived[1:]:
            channel.basic_nack(other_tag, requeue=True)
        return arrived[0]

    def _abandon_if_forked(self) -> None:
        if self._pid != os.getpid():
            # A forked child shares the parent's socket: abandon it (and the parent's delivery)
            # without closing or settling anything, which would act on the parent's connection.
            self._connection, self._channel, self._handed, self._pid = None, None, [], os.getpid()

    def _ensure_channel(self) -> BlockingChannel:
        # A job may run for hours between two take() calls; if the broker dropped the connection
        # meanwhile, pika may only notice at the first I/O, which take()'s retry covers.
        if self._connection is None or not self._connection.is_open:
            self._reset()
            self._connection = self._nodes.connect()
        if self._channel is None or not self._channel.is_open:
            self._channel = self._connection.channel()
            self._prefetch = 0
        return self._channel

    def _qos(self, channel: BlockingChannel, prefetch: int) -> None:
        """Make `prefetch` the limit of the channel's next subscriptions (basic.qos applies to
        the consumers created after it), unless it is already."""
        if self._prefetch != prefetch:
            channel.basic_qos(prefetch_count=prefetch)
            self._prefetch = prefetch

    def _drop_channel(self) -> None:
        channel, self._channel = self._channel, None
        _close_quietly(channel)

    def _reset(self) -> None:
        self._topology.forget()
        self.close()
