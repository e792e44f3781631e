"""The broker seam: a producer sends job ids to '<queue>_<priority>' queues; a consumer hands them out.

The broker only ever carries a job's id (its decimal string) or the control word 'die'; the
database row stays the truth. Queue names: '<queue>_<priority>' per priority, '<queue>_0' for
control messages, '<queue>_<priority>_<delay_ms>' for delayed messages (a TTL queue that
dead-letters into '<queue>_<priority>').
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..errors import BgqError

DIE = "die"
CONTROL_PRIORITY = 0


class BrokerError(BgqError):
    """The broker refused or did not confirm a message."""


class BrokerConnectionError(BrokerError):
    """The broker cannot be reached."""


class Producer(Protocol):
    def publish(self, job_id: int, queue: str, priority: int, delay_ms: int | None = None) -> None:
        """Send `job_id` to '<queue>_<priority>' (after `delay_ms` through a TTL queue when given).

        Returns once the broker confirmed the message as routed and stored; raises BrokerError
        (or BrokerConnectionError) otherwise. Reconnects by itself after a lost connection.
        """

    def publish_die(self, queue: str) -> None:
        """Send the control word 'die' to '<queue>_0'."""

    def close(self) -> None:
        """Close the connection (a later call reconnects)."""


class Delivery(Protocol):
    """One message taken by a consumer; it is neither acknowledged nor returned yet."""

    body: str  # the job id as a decimal string, or 'die'
    priority: int  # the priority of the queue it came from (0: the control queue)

    def ack(self) -> None:
        """Acknowledge it: the broker forgets it. Idempotent. A consumer may hold the
        acknowledgement back until every delivery of the same take is settled, and send them
        together (then the ack() that settles the last one raises if sending fails)."""

    def reject(self) -> None:
        """Return it to its queue for another consumer. Idempotent; a no-op after ack()."""


class Consumer(Protocol):
    def take(self, queue: str, priorities: Sequence[int], timeout: float | None = None) -> Delivery | None:
        """Wait up to `timeout` seconds (None: for ever) for one message.

        The order of preference is '<queue>_0', then '<queue>_<p>' for each p in `priorities` in
        the order given. A message waiting in a queue is returned before any message of a less
        preferred queue. When all queues are empty, the first message to arrive in any of them is
        returned; when several arrive at once, the most preferred one, and the others go back to
        their queues. Returns None on timeout. The consumer holds no message besides the Delivery
        it returned; one that is neither ack()ed nor reject()ed goes back to its queue at the next
        take().
        """

    def take_batch(
        self, queue: str, priorities: Sequence[int], limit: int, timeout: float | None = None
    ) -> Sequence[Delivery]:
        """Up to `limit` messages, all from the most preferred queue (as take() orders them) that
        has messages waiting; when all are empty, waits up to `timeout` as take() does ([] on
        timeout). The consumer holds no message besides those it returned; any neither ack()ed
        nor reject()ed goes back to its queue at the next take() or take_batch()."""

    def close(self) -> None:
        """Close the connection; unacknowledged messages go back to their queues."""


class Broker(Producer, Protocol):
    """A producer that can also make consumers (e.g. bgq.broker.rabbitmq.RabbitMQ)."""

    def consumer(self) -> Consumer: ...


def queue_with_priority(queue: str, priority: int) -> str:
    return f"{queue}_{priority}"


def parse_priorities(option: str | None, available: Sequence[int]) -> list[int]:
    """`consume -p`: 'N', 'a-b', '-b', 'a-' or None against the configured priorities, in their order."""
    listing = "[" + ",".join(str(p) for p in available) + "]"
    if option is None or option.strip() == "":
        return list(available)
    text = option.strip()
    if "-" not in text:
        if not text.isdigit() or int(text) not in available:
            raise BgqError(f"Priority {text} is not in available priorities {listing}")
        return [int(text)]
    low_text, _, high_text = text.partition("-")
    if (low_text and not low_text.isdigit()) or (high_text and not high_text.isdigit()) or "-" in high_text:
        raise BgqError(f"Priority range {text!r} is not N, A-B, -B or A- with whole numbers.")
    ordered = sorted(available)
    low = int(low_text) if low_text else ordered[0]
    high = int(high_text) if high_text else ordered[-1]
    chosen = [p for p in available if low <= p <= high]
    if not chosen:
        raise BgqError(f"Priority {text} has not intersections with availables priorities {listing}")
    return chosen
