"""Sends job ids to the broker once the database holds them; a failed send leaves the job BROKER_FAILED."""

from __future__ import annotations

import functools

from ..config import Config
from ..errors import BgqError
from ..model import Message
from ..sql import retry
from ..sql.database import Store
from . import outbox


class Sender:
    """The broker side of every part: publishing, finishing, reaping and requeueing all end here.
    In cron mode (no producer) every method is a no-op."""

    def __init__(self, config: Config, store: Store) -> None:
        self.config = config
        self.store = store

    def send(self, jobs: list[Message]) -> None:
        """Send job ids to the broker; a failed send marks the job BROKER_FAILED for `bgq process`.

        Never raises for a job the database holds already: when the broker and then the mark
        fail too (the database cut as well), the job stays READY without a message, which the
        lost-message pass sends again after lost_message_timeout; the other jobs are still sent."""
        producer = self.config.producer
        if producer is None:
            return
        for job_id, queue, priority, delay_ms in jobs:
            try:
                producer.publish(job_id, queue, priority, delay_ms or None)
            except BgqError as exc:
                log = self.config.logger
                log.critical(f"bgq: Publishing to the broker failed. (ID: {job_id})", exc_info=exc)
                error = f"{type(exc).__name__}: {exc}"
                try:
                    mark = functools.partial(self.store.procs.broker_failed, job_id=job_id, error=error)
                    retry.in_transaction(self.store.database, mark)
                except BgqError as failed:
                    log.critical(
                        "bgq: Marking the job BROKER_FAILED failed as well; the lost-message pass "
                        f"sends it again. (ID: {job_id}; {failed})"
                    )

    def send_pending(self, items: list[outbox.Pending]) -> None:
        """The outbox's flush after the application's commit."""
        self.send([Message(i.job_id, i.queue, i.priority, i.delay_ms) for i in items])

    def send_job(self, job_id: int) -> None:
        """Send a job a procedure made ready (promoted, requeued, reaped), with its own delay."""
        if self.config.producer is None:
            return
        with self.store.database.transaction() as conn:
            row = self.store.procs.get_job(conn, job_id)
        if row is not None:
            self.send([Message(job_id, row["queue"], row["priority"], row["postponed_by"])])
