"""Publishing: one job, a bulk of them, or inside the application's transaction (the outbox)."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from ..config import Config
from ..db import dialect_name
from ..errors import PublishError
from ..model import Message, Mode, NewJob
from ..sql.database import Store
from . import outbox
from . import params as params_codec
from .sender import Sender
from .validate import new_job

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

#: Parameter bytes per multi-row INSERT of a bulk: far below MariaDB's default max_allowed_packet
#: (16 MiB) even when escaping doubles them; a larger bulk is inserted in several statements.
BULK_INSERT_BYTES = 4 * 1024 * 1024


def _by_size(jobs: list[NewJob]) -> Iterator[list[NewJob]]:
    """Consecutive runs of `jobs` whose parameters take at most BULK_INSERT_BYTES (one job at least)."""
    chunk: list[NewJob] = []
    size = 0
    for job in jobs:
        job_size = params_codec.encoded_size(job.parameters_json, job.parameters)
        if chunk and size + job_size > BULK_INSERT_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(job)
        size += job_size
    if chunk:
        yield chunk


@dataclass
class Bulk:
    """Jobs published since start_bulk(): those not inserted yet, the ids of those inserted (in
    publish order), and the batch sent last, its ids not read yet (Procs.sends_many)."""

    jobs: list[NewJob] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    sent: tuple[Callable[[], list[int]], list[NewJob]] | None = None


class Publisher:
    """Validates a job completely, then inserts it (`{table}_insert`) and hands its id to the Sender."""

    def __init__(self, config: Config, store: Store, sender: Sender) -> None:
        self.config = config
        self.store = store
        self.sender = sender
        # The bulk in progress belongs to the thread (or asyncio task) that started it: a web app's
        # one module-level queue serves many threads, and one request's bulk must not take in the
        # jobs other threads publish meanwhile.
        self._bulk: ContextVar[Bulk | None] = ContextVar(f"bgq_bulk_{id(self)}", default=None)

    def publish(
        self,
        callback_name: str,
        parameters: list[Any] | tuple[Any, ...] | dict[str, Any] | None = None,
        *,
        serial_group: str | None = None,
        identifier: str | None = None,
        mode: Mode | str = Mode.NORMAL,
        postpone_by: int | dt.timedelta | None = None,
        priority: int | None = None,
        coalesce_threshold: int | None = None,
        connection: Session | Connection | None = None,
    ) -> int | None:
        """Queue.publish (its docstring is the contract)."""
        job = new_job(
            self.config, callback_name, parameters, serial_group, identifier, mode, postpone_by, priority,
            coalesce_threshold,
        )  # fmt: skip
        batch = self._bulk.get() if connection is None else None
        if batch is not None:
            batch.jobs.append(job)
            if len(batch.jobs) >= self.config.bulk_size:
                self._flush_bulk(batch)
            return None
        store = self.store
        if connection is None:
            job_id = store.procs.insert_alone(job)
            self.sender.send([Message(job_id, job.queue, job.priority, job.postponed_by)])
            return job_id
        conn = connection.connection() if outbox.is_session(connection) else connection
        if not isinstance(conn, Connection):
            raise PublishError("connection must be a SQLAlchemy Session or Connection.")
        if dialect_name(conn.dialect.name) != store.database.dialect.name:
            raise PublishError(
                f"connection is {conn.dialect.name}, the queue's database {store.database.dialect.name}."
            )
        try:
            job_id = store.procs.insert(conn, job)
        except DBAPIError as exc:  # on the application's connection: a bgq error all the same
            raise store.database.translate(exc) from exc
        if self.config.producer is not None:
            outbox.add(
                connection,
                Message(job_id, job.queue, job.priority, job.postponed_by),
                self.sender.send_pending,
            )
        return job_id

    async def publish_async(
        self,
        callback_name: str,
        parameters: list[Any] | tuple[Any, ...] | dict[str, Any] | None = None,
        *,
        serial_group: str | None = None,
        identifier: str | None = None,
        mode: Mode | str = Mode.NORMAL,
        postpone_by: int | dt.timedelta | None = None,
        priority: int | None = None,
        coalesce_threshold: int | None = None,
    ) -> int:
        """Queue.publish_async (its docstring is the contract): the same checks and INSERT as
        publish. PostgreSQL: on psycopg's AsyncConnection (bgq/db/aio_postgres.py); MySQL: publish's
        own insert on a thread (asyncio.to_thread). The broker send after it is publish's own."""
        job = new_job(
            self.config, callback_name, parameters, serial_group, identifier, mode, postpone_by, priority,
            coalesce_threshold,
        )  # fmt: skip
        store = self.store
        if not store.checked:  # once: opens the engine and checks the install (blocking calls)
            await asyncio.to_thread(lambda: store.procs)
        if store.database.dialect.name == "postgres":
            job_id = await store.procs.insert_async(job)  # on store.database.aio
        else:
            job_id = await asyncio.to_thread(store.procs.insert_alone, job)
        self.sender.send([Message(job_id, job.queue, job.priority, job.postponed_by)])
        return job_id

    async def aclose(self) -> None:
        """Close the running event loop's publish_async connection, if it has one."""
        if self.store.opened:
            await self.store.database.aclose()

    def start_bulk(self) -> Bulk:
        """Buffer this thread's (or asyncio task's) publish() calls; every `bulk_size` jobs go in one
        INSERT (PostgreSQL: of arrays; MySQL: of a row of values per job), more only when their
        parameters exceed BULK_INSERT_BYTES. Other threads' calls insert at once, as before."""
        batch = self._bulk.get()
        if batch is None:
            batch = Bulk()
            self._bulk.set(batch)
        return batch

    def end_bulk(self) -> list[int]:
        """Insert what this thread buffered and return the ids of every job it published since
        start_bulk()."""
        batch = self._bulk.get()
        if batch is None:
            return []
        try:
            self._flush_bulk(batch, last=True)
            return batch.ids
        finally:
            self._bulk.set(None)

    @contextmanager
    def bulk(self) -> Iterator[Bulk]:
        """`with queue.bulk() as batch: ...` then `batch.ids`; an exception inside inserts nothing more."""
        batch = self.start_bulk()
        try:
            yield batch
        except BaseException:
            self._bulk.set(None)
            self._abandon(batch)
            raise
        self.end_bulk()

    def _flush_bulk(self, batch: Bulk, *, last: bool = False) -> None:
        """Insert the buffered jobs. One statement's worth (where procs.sends_many: PostgreSQL,
        MariaDB) is sent, and its ids read at the next flush (or now, when `last`), so that the
        server inserts one batch while publish() validates the next. A failed batch ends the
        bulk: the jobs not inserted yet are dropped, and batch.ids stays the ids of the jobs
        published first, in order."""
        if not batch.jobs and batch.sent is None:
            return
        jobs, batch.jobs = batch.jobs, []
        procs = self.store.procs
        try:
            chunks = list(_by_size(jobs))
            if len(chunks) == 1 and procs.sends_many:
                statement = procs.insert_many_statement(jobs)  # built while the batch before runs
                self._read_sent(batch)
                batch.sent = (procs.send_insert_many(statement), jobs)
                if last:
                    self._read_sent(batch)
                return
            self._read_sent(batch)
            if chunks:
                with self.store.database.transaction() as conn:
                    ids = [i for chunk in chunks for i in procs.insert_many(conn, chunk)]
                self._inserted(batch, jobs, ids)
        except BaseException:
            self._bulk.set(None)
            self._abandon(batch)
            raise

    def _abandon(self, batch: Bulk) -> None:
        """A bulk ended by an exception: the buffered jobs are dropped; the batch already sent
        (if any) is read, so that its ids join batch.ids and its connection is given back. Its
        own error is only logged: the exception that ended the bulk goes on."""
        batch.jobs = []
        try:
            self._read_sent(batch)
        except Exception as exc:
            self.config.logger.error(f"bgq: The last batch sent by an interrupted bulk failed. ({exc})")

    def _read_sent(self, batch: Bulk) -> None:
        """Wait for the batch sent last, if any: its ids join batch.ids, its jobs go to the broker."""
        if batch.sent is not None:
            read, jobs = batch.sent
            batch.sent = None
            self._inserted(batch, jobs, read())

    def _inserted(self, batch: Bulk, jobs: list[NewJob], ids: list[int]) -> None:
        batch.ids.extend(ids)
        self.sender.send(
            [Message(i, j.queue, j.priority, j.postponed_by) for i, j in zip(ids, jobs, strict=True)]
        )
