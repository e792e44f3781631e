"""One statement in a transaction of its own, in one round trip: kept autocommit DBAPI connections.

`publish()` without a connection needs one INSERT committed, nothing more. Through the engine
that costs four round trips (the pool's pre-ping, BEGIN, the INSERT, COMMIT) and SQLAlchemy's
layers around each; here it is one: the INSERT in autocommit mode on the DBAPI cursor of a
connection kept open between calls.

The connections are bgq's own (opened through the engine, so they get its session settings, then
detached from its pool), kept on a last-in-first-out list: a thread that publishes in a loop gets
the same connection back each time, and a thread that ends leaves nothing behind. At most
`in_use` are open at once, `idle` of them kept between calls; a forked child forgets the
parent's (os.register_at_fork) and opens its own.

A lost connection is replaced only where it is certain the statement was not sent. Before each
statement the kept connection is checked without a round trip (a killed session, a server
restart or an idle timeout leaves the socket readable: the server's goodbye, then end of file)
and pinged when it has been idle longer than PING_AFTER (what a silent network loss would
otherwise hide); a connection that fails either check is closed and another one taken, and the
statement goes out once. A connection lost *after* the statement went out leaves its outcome
unknown (the server may have committed it before the connection broke), so it is never sent
again: the caller gets an OutcomeUnknownError (a ConnectionLostError that is not retryable).

`send` splits the same statement in two: it goes out at once and its reply is read later
(`Sent.rows`), so that the server inserts a bulk's batch while the caller validates the next one.
Meanwhile the connection is the Sent's; one dropped unread (its bulk never ended) is closed.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ..errors import BgqError, ConnectionLostError, DatabaseError, OutcomeUnknownError, ReadOnlyError

if TYPE_CHECKING:
    from . import Database

#: Seconds a kept connection may sit idle before it is pinged (one extra round trip) ahead of its
#: next statement; within that, the socket check alone stands for the engine's pre-ping.
PING_AFTER = 1.0
#: Seconds to wait for a connection when `in_use` are busy (the engine's pool_timeout).
WAIT_S = 30.0
_ANY_EVENT = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP


class _Kept:
    """One autocommit DBAPI connection, its cursor, and a poller on its socket."""

    __slots__ = ("conn", "cursor", "poller", "used", "generation")

    def __init__(self, conn: Any, fd: int, generation: int) -> None:
        self.conn = conn
        self.cursor = conn.cursor()
        self.poller = select.poll()
        self.poller.register(fd, _ANY_EVENT)
        self.used = time.monotonic()
        self.generation = generation

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a broken connection: nothing left to do
            self.conn.close()


class Alone:
    """Single-statement transactions on kept autocommit connections (one per Database)."""

    def __init__(self, database: Database, in_use: int, idle: int) -> None:
        self.database = database
        self.dialect = database.dialect
        self.in_use = in_use
        self.idle = idle
        self._free: list[_Kept] = []  # idle connections, the most recently used last
        self._slots = threading.BoundedSemaphore(in_use)
        self._generation = 0  # close() bumps it: connections out at that moment close on return
        me = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forked(me))

    def execute(self, sql: str, values: Sequence[Any]) -> tuple[list[tuple[Any, ...]], int | None]:
        """Run `sql` in a transaction of its own; return (its rows, the cursor's lastrowid).

        Raises the translated error; a connection lost after the statement went out raises a
        OutcomeUnknownError (not retryable): the statement may have committed."""
        self._acquire()
        try:
            kept = self._take()
            try:
                cursor = kept.cursor
                cursor.execute(sql, values)
                # rownumber: None when the statement returned no rows (psycopg), 0 (PyMySQL, whose
                # fetchall then returns nothing); cheaper than building `description`.
                rows = list(cursor.fetchall()) if cursor.rownumber is not None else []
                lastrowid = getattr(cursor, "lastrowid", None)
            except self.database.driver_error as exc:
                raise self._failed(kept, exc) from exc
            except BaseException:  # an interrupt mid-statement: the connection's state is unknown
                kept.close()
                raise
            self._give_back(kept)
            return rows, lastrowid
        finally:
            self._slots.release()

    def send(self, sql: str, values: Sequence[Any]) -> Sent:
        """Put `sql` on the wire, in a transaction of its own, and return without waiting for
        the server (Dialect.send, where `can_send`); `Sent.rows()` waits for its rows. The
        caller works meanwhile (a bulk publish validates its next batch) while the server runs
        and commits the statement. Until its rows are read, the connection (and one of the
        `in_use` slots) belongs to the Sent. Errors as `execute`'s, from `rows()` once the
        statement went out."""
        self._acquire()
        try:
            kept = self._take()
            try:
                self.dialect.send(kept.conn, sql, values)
            except self.database.driver_error as exc:
                raise self._failed(kept, exc) from exc
            except BaseException:  # an interrupt mid-send: the connection's state is unknown
                kept.close()
                raise
            return Sent(self, kept)
        except BaseException:
            self._slots.release()
            raise

    def _acquire(self) -> None:
        if not self._slots.acquire(timeout=WAIT_S):
            raise DatabaseError(f"No database connection became free for bgq within {WAIT_S:.0f} s.")

    def _failed(self, kept: _Kept, exc: BaseException) -> BgqError:
        """The error to raise for a driver error on `kept`, which goes back to the idle list
        when it is still usable and is closed when it is not."""
        error = self.database.translate(exc)
        if isinstance(error, ReadOnlyError):  # a standby: nothing was written; every kept
            kept.close()  # connection reaches that server, so all are dropped and opened again
            self.close()
            return error
        usable = self.dialect.idle_outside_transaction(kept.conn)
        if usable:
            self._give_back(kept)
        else:
            kept.close()
        if not usable or isinstance(error, ConnectionLostError):
            return _outcome_unknown(exc)
        return error

    def close(self) -> None:
        """Close the idle connections; those in use close when their statement is done."""
        self._generation += 1
        free, self._free = self._free, []
        for kept in free:
            kept.close()

    def after_fork(self) -> None:
        """In a forked child: forget the parent's connections (never close them: closing would
        end the parent's sessions) and the parent's threads' slots."""
        self._generation += 1
        self._free = []
        self._slots = threading.BoundedSemaphore(self.in_use)

    def _take(self) -> _Kept:
        """An idle connection that passes the checks, or a new one."""
        while True:
            try:
                kept = self._free.pop()
            except IndexError:
                return self._open()
            if self._alive(kept):
                return kept
            kept.close()

    def _alive(self, kept: _Kept) -> bool:
        """False when the connection is closed, its socket has something to say while idle
        (the server closed it, or is about to), or a ping after PING_AFTER idle fails."""
        if not self.dialect.idle_outside_transaction(kept.conn) or kept.poller.poll(0):
            return False
        if time.monotonic() - kept.used > PING_AFTER:
            try:
                self.database.engine.dialect.do_ping(kept.conn)
            except self.database.driver_error:
                return False
        return True

    def _open(self) -> _Kept:
        try:
            fairy = self.database.engine.raw_connection()
        except (sa.exc.DBAPIError, self.database.driver_error) as exc:
            raise self.database.translate(exc) from exc
        conn = fairy.driver_connection
        assert conn is not None  # a fresh checkout holds its driver connection
        fairy.detach()  # bgq's own from now on: never back to the engine's pool
        try:
            fd = self.dialect.keep_autocommit(conn)
            return _Kept(conn, fd, self._generation)
        except self.database.driver_error as exc:
            conn.close()
            raise self.database.translate(exc) from exc

    def _give_back(self, kept: _Kept) -> None:
        kept.used = time.monotonic()
        if kept.generation == self._generation and len(self._free) < self.idle:
            self._free.append(kept)
        else:
            kept.close()


class Sent:
    """A statement that Alone.send put on the wire, its rows not read yet. `rows()` reads them
    (once) and gives the connection back. A Sent dropped unread (a thread that ended inside a
    bulk) closes its connection and frees its slot; whether the server committed the statement
    before it saw the connection close is then unknown."""

    def __init__(self, alone: Alone, kept: _Kept) -> None:
        self._alone = alone
        self._kept = kept
        self._pid = os.getpid()
        self._unread = weakref.finalize(self, _dropped, kept, alone._slots, self._pid)

    def rows(self) -> list[tuple[Any, ...]]:
        """The statement's rows (Dialect.read), once the server has committed it; raises as
        Alone.execute does."""
        if os.getpid() != self._pid:  # the parent's connection: reading it would take its replies
            raise DatabaseError("A statement sent before a fork cannot be read in the child process.")
        if not self._unread.detach():
            raise DatabaseError("The rows of this statement were read already.")
        alone, kept = self._alone, self._kept
        try:
            try:
                rows = alone.dialect.read(kept.conn)
            except alone.database.driver_error as exc:
                raise alone._failed(kept, exc) from exc
            except BaseException:  # an interrupt mid-wait: the connection's state is unknown
                kept.close()
                raise
            alone._give_back(kept)
            return rows
        finally:
            alone._slots.release()


def _dropped(kept: _Kept, slots: threading.BoundedSemaphore, pid: int) -> None:
    """A Sent garbage-collected unread: close its connection and free its slot (in the process
    that sent it; a forked child leaves the parent's connection alone)."""
    if os.getpid() == pid:
        kept.close()
        slots.release()


def _forked(alone: weakref.ref[Alone]) -> None:
    found = alone()
    if found is not None:
        found.after_fork()


def _outcome_unknown(exc: BaseException) -> BgqError:
    return OutcomeUnknownError(
        "The database connection was lost after the statement was sent: it may or may not have been "
        f"committed, so bgq did not send it again (look before publishing again). ({exc})"
    )
