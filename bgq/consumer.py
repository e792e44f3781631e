"""`bgq consume`: take job ids from the broker, claim, acknowledge, run, finish; stop gracefully."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence

from .broker import DIE, BrokerError, Consumer, Delivery
from .errors import BgqError, ConfigError
from .model import WorkerMode
from .parts import Parts
from .stopping import GracefulStop
from .workers import Registry

#: Seconds one take() waits before the loop looks at its stop flag again.
POLL_SECONDS = 1.0


def consume(
    queue: Parts, sub_queue: str | None, jobs: int, priorities: Sequence[int], stop: GracefulStop
) -> int:
    """Handle `jobs` messages (0: until stopped) and return the process exit code (0)."""
    producer = queue.config.producer
    if producer is None or not hasattr(producer, "consumer"):
        raise ConfigError(
            "consume needs a broker: configure the queue with producer=bgq.broker.rabbitmq.RabbitMQ(...)."
        )
    consumer: Consumer = producer.consumer()
    base = queue.config.queue_name(sub_queue)
    log = queue.config.logger
    executor = queue.executor
    handled = 0
    registry = Registry(queue, WorkerMode.CONSUME, base)  # listed in {table}_worker (bgq/workers.py)
    registry.start()
    queue.reaper.start()  # stalled jobs are reaped without cron (bgq/reaper.py)
    try:
        while (jobs == 0 or handled < jobs) and not stop.requested and not executor.should_die:
            queue.scheduler.tick()  # fires due schedules, at most once a second
            try:
                delivery = consumer.take(base, priorities, timeout=POLL_SECONDS)
            except BrokerError as exc:  # the next take() reconnects
                log.error(f"bgq: The broker connection failed; reconnecting. ({exc})")
                time.sleep(POLL_SECONDS)
                continue
            if delivery is None:
                continue
            if delivery.body == DIE:
                delivery.ack()
                log.info("bgq: die message received; the consumer exits.")
                return 0
            try:
                job_id = int(delivery.body)
            except ValueError:
                log.error(f"bgq: Ignoring a message that is not a job id: {delivery.body[:100]!r}")
                delivery.ack()
                continue
            try:
                executor.process_job(job_id, on_claimed=functools.partial(_ack, delivery, log))
            except BgqError as exc:  # the claim failed (database down?): give the message back
                delivery.reject()
                log.critical(f"bgq: Unexpected error occurred. (ID: {job_id})", exc_info=exc)
                time.sleep(POLL_SECONDS)
            handled += 1
    finally:
        queue.reaper.stop()
        registry.stop()
        consumer.close()
    return 0


def _ack(delivery: Delivery, log: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
    """Acknowledge after the claim committed. If that fails the broker redelivers the id, and the
    claim already decided who runs the job: the duplicate is 'unexpected' or 'skipped' and is
    dropped, so the job still runs exactly once. A failed ack never stops this job."""
    try:
        delivery.ack()
    except BrokerError as exc:
        log.warning(f"bgq: Acknowledging a message failed; its duplicate will be dropped. ({exc})")
