"""The database seam: one engine per queue, explicit transactions, the one call path of every statement."""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection

from ..errors import (
    BgqError,
    ConfigError,
    ConnectionLostError,
    DatabaseError,
    DatabaseUnavailableError,
    NodeNotReadyError,
    ReadOnlyError,
)
from .autocommit import Alone, Sent
from .dialect import Dialect, InstalledRoutine, Proc
from .urls import dialect_for, dialect_name, normalise_url, render_url

if TYPE_CHECKING:
    from .aio_postgres import AsyncPostgres

__all__ = [
    "Database", "Dialect", "InstalledRoutine", "Proc", "Sent", "dialect_for", "dialect_name", "normalise_url",
    "render_url",
]  # fmt: skip


def _check_url_options(engine: sa.Engine) -> None:
    """Refuse, before anything connects, a URL option the driver's connect() does not take (a
    typo in `?conect_timeout=5` on MySQL would fail inside every connection attempt as a TypeError).
    psycopg hands unknown options to libpq, which names them itself."""
    cargs, cparams = engine.dialect.create_connect_args(engine.url)
    try:
        inspect.signature(engine.dialect.loaded_dbapi.connect).bind(*cargs, **cparams)
    except TypeError as exc:
        raise DatabaseError(f"Invalid database URL: {engine.dialect.driver}.connect() {exc}.") from None


#: A statement's parameters: a sequence for %s placeholders, a mapping for %(name)s ones.
Params = Sequence[Any] | Mapping[str, Any]


def _params(params: Params) -> tuple[Any, ...] | dict[str, Any]:
    """A statement's parameters as the driver takes them: %s by position, %(name)s by name."""
    return dict(params) if isinstance(params, Mapping) else tuple(params)


def _one_line(exc: BaseException) -> str:
    """A driver error's message on one line (psycopg's carry a second line of context)."""
    return " ".join(str(exc).split())


_PG_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE: no transaction begun on the connection

#: Default of the Queue option `lock_timeout`, in seconds.
LOCK_TIMEOUT = 5
#: The engine's pool: connections kept idle, and opened beyond them at most; the same bounds for
#: the single-statement connections (bgq/db/autocommit.py), a second set beside the pool.
POOL_SIZE = 2
MAX_OVERFLOW = 8


class Database:
    """bgq's own connection pool to the application's database, and the calls it makes.

    `lock_timeout` (seconds; 0 leaves the server's settings alone) bounds how long a frozen bgq
    session (SIGSTOP, a paused VM, a partition) can hold up the others: every new connection of
    this engine waits at most that long for a lock, and the server ends it once it has been idle
    inside a transaction that long (MariaDB `idle_transaction_timeout`, PostgreSQL
    `idle_in_transaction_session_timeout`; MySQL 8 has no such setting, see bgq/db/mysql.py).

    `pooled` (PostgreSQL): `url` leads to a transaction-pooling PgBouncer, which hands each
    transaction whichever server connection is free, so bgq keeps no state in a session: no
    session `SET` (lock_timeout and the idle-in-transaction bound are set with `SET LOCAL` at the
    start of each transaction instead; an idle transaction is the pooler's to cut, its
    `idle_transaction_timeout`), no server-side prepared statement (psycopg's
    `prepare_threshold=None`; `send` uses unnamed statements). `listen_url`: a direct URL (not
    through the pooler) for the LISTEN connection of idle `bgq work` processes (`listener_connect`).
    """

    def __init__(
        self,
        url: str,
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
        lock_timeout: int = LOCK_TIMEOUT,
        *,
        pooled: bool = False,
        listen_url: str | None = None,
    ) -> None:
        self.url = normalise_url(url)
        self.log = logger or logging.getLogger("bgq")
        self.dialect = dialect_for(self.url)
        if pooled and self.dialect.name != "postgres":
            raise ConfigError('Option "pooled" is for PostgreSQL behind a transaction pooler (PgBouncer).')
        self.pooled = pooled
        self.listen_url = normalise_url(listen_url) if listen_url else None
        # READ COMMITTED on both dialects: after a procedure takes a group lock, its reads see the
        # latest committed rows (MySQL's REPEATABLE READ would keep an older snapshot). The
        # setting lives on bgq's own engine, never on the application's.
        self.engine = sa.create_engine(
            self.url,
            isolation_level="READ COMMITTED",
            pool_pre_ping=True,
            pool_size=POOL_SIZE,
            max_overflow=MAX_OVERFLOW,
            # Behind a transaction pooler a statement prepared on one server connection is
            # unknown on the next one: psycopg then prepares nothing (PgBouncer 1.18 routes none).
            connect_args={"prepare_threshold": None} if self.pooled else {},
        )
        _check_url_options(self.engine)
        event.listen(self.engine, "handle_error", self._on_error)
        # The driver's own base exception: raw cursors (install-procs' DDL) raise it unwrapped.
        self.driver_error: type[Exception] = self.engine.dialect.loaded_dbapi.Error
        self.lock_timeout = lock_timeout
        if lock_timeout and self.pooled:
            event.listen(self.engine, "begin", self._on_begin)
        elif lock_timeout:
            event.listen(self.engine, "connect", self._on_connect)
        if self.dialect.name == "mysql":  # Galera: read what the cluster committed (causal_sync)
            event.listen(self.engine, "connect", self._on_connect_causal)
            event.listen(self.engine, "begin", self._on_begin_causal)
        self._local = threading.local()
        self.alone = Alone(self, POOL_SIZE + MAX_OVERFLOW, POOL_SIZE)
        self._aio: AsyncPostgres | None = None
        # `call`'s statements and the fast path's result columns, by (table, procedure).
        self._statements: dict[tuple[str, str], str] = {}
        self._columns: dict[tuple[str, str], list[str]] = {}

    def _on_connect(self, dbapi_connection: Any, _record: Any) -> None:
        """Bound lock waits and idle transactions on bgq's own sessions (never the application's)."""
        cursor = dbapi_connection.cursor()
        try:
            for statement in self.dialect.session_sql(dbapi_connection, self.lock_timeout):
                cursor.execute(statement)
        finally:
            cursor.close()
        dbapi_connection.commit()  # PostgreSQL: a SET inside a rolled-back transaction is undone

    def _on_connect_causal(self, dbapi_connection: Any, record: Any) -> None:
        """Remember on the connection the statement that opens its transactions (Galera)."""
        statement = self.dialect.causal_sync(dbapi_connection)
        if statement:
            record.info["bgq_causal_sync"] = statement

    def _on_begin_causal(self, conn: Connection) -> None:
        """Galera: the transaction's first statement waits until this node has applied every
        commit the cluster certified before it (bgq/db/mysql.py `causal_sync`)."""
        statement = conn.info.get("bgq_causal_sync")
        if statement:
            conn.exec_driver_sql(statement)

    def _on_begin(self, conn: Connection) -> None:
        """Pooled mode: the bounds of `_on_connect`, for this transaction only (SET LOCAL), in the
        transaction's first statement; the server connection forgets them at COMMIT/ROLLBACK."""
        conn.exec_driver_sql(self.dialect.transaction_sql(self.lock_timeout))

    def _on_error(self, context: Any) -> None:
        """A lost connection (found by the pre-ping or mid-statement) is replaced; say so loudly.

        A Galera node that is not Synced (NodeNotReadyError) refuses every query until it is: its
        session is dropped like a lost one (only this one: the pool's other connections may be on
        other nodes), so the next try connects again, through haproxy to a Synced node.

        A server that refuses writes (ReadOnlyError: a standby, the old primary's address after
        a failover) counts as a disconnect too: SQLAlchemy then invalidates this connection and
        every pooled one opened before it (they all reach that server), and the next checkout
        connects again, which a multi-host URL with target_session_attrs=read-write steers to
        the primary."""
        orig = context.original_exception
        error = self.dialect.translate(orig) if orig is not None else None
        if not context.is_disconnect and isinstance(error, NodeNotReadyError):
            context.is_disconnect = True
            context.invalidate_pool_on_disconnect = False
        elif isinstance(error, ReadOnlyError):
            context.is_disconnect = True
        if context.is_disconnect and orig is not None:
            self._say_reconnecting(error, orig)

    def _say_reconnecting(self, error: BgqError | None, orig: BaseException) -> None:
        """The one line a dropped session logs (SQLAlchemy's handle_error, and `call`'s cursor)."""
        if isinstance(error, NodeNotReadyError):
            self.log.warning(
                f"bgq: The database node is not ready (Galera: not Synced); reconnecting. ({orig})"
            )
        elif not isinstance(error, ReadOnlyError):  # (the caller logs a ReadOnlyError, once)
            self.log.critical(f"bgq: The database connection was lost; reconnecting. ({_one_line(orig)})")

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One transaction: BEGIN ... COMMIT, or ROLLBACK on error; driver errors translated.

        On a thread inside `pinned()`, it runs on that thread's own connection instead of
        checking one out of the pool (and pinging it) each time.
        """
        conn = getattr(self._local, "conn", None)
        outer = getattr(self._local, "outer", None)
        try:
            if outer is not None:
                with outer.begin_nested():
                    yield outer
                return
            if conn is None:
                with self.engine.begin() as conn:
                    yield conn
                return
            if conn.closed or conn.invalidated:
                conn.close()
                conn = self._local.conn = self.engine.connect()
            with conn.begin():
                yield conn
        except (sa.exc.DBAPIError, self.driver_error) as exc:
            raise self.translate(exc) from exc

    @contextmanager
    def one_transaction(self) -> Iterator[Connection]:
        """Run every `transaction()` of this thread inside one transaction until the block ends,
        each as a savepoint of it (install-procs on PostgreSQL, whose DDL is transactional: its
        install lock is then transaction-scoped, pg_advisory_xact_lock). COMMIT at the end,
        ROLLBACK of everything on an error."""
        if getattr(self._local, "outer", None) is not None:
            raise RuntimeError("one_transaction() does not nest")
        try:
            with self.engine.begin() as conn:
                self._local.outer = conn
                try:
                    yield conn
                finally:
                    self._local.outer = None
        except (sa.exc.DBAPIError, self.driver_error) as exc:
            raise self.translate(exc) from exc

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """Keep one connection for this thread's transactions (a worker's hot loop); a lost
        connection is replaced at the next transaction."""
        self._local.conn = self.engine.connect()
        try:
            yield
        finally:
            conn, self._local.conn = self._local.conn, None
            conn.close()

    def translate(self, exc: BaseException) -> BgqError:
        """The bgq exception for a driver error (SQLAlchemy-wrapped or raw), by error code."""
        wrapped = exc if isinstance(exc, sa.exc.DBAPIError) else None
        orig: BaseException = wrapped.orig if wrapped is not None and wrapped.orig is not None else exc
        error = self.dialect.translate(orig)
        if error is None:
            if wrapped is not None and wrapped.connection_invalidated:  # SQLAlchemy saw a disconnect
                error = ConnectionLostError(f"The database connection was lost: {orig}")
            else:
                error = DatabaseError(f"{type(orig).__name__}: {orig}")
        if type(error) is DatabaseUnavailableError:  # never connected: say where it tried
            # On one line: libpq lists each host of a multi-host URL it tried on a line of its own.
            error = DatabaseUnavailableError(
                f"Cannot reach the database at {self.safe_url}: {_one_line(orig)}"
            )
        return error

    @property
    def safe_url(self) -> str:
        return render_url(self.url)

    # --- the call seam: every statement bgq runs goes through one of these methods (and
    # execute_alone, send_alone, detached, listener_connect, aio), and a driver error raised by
    # any of them leaves it translated by `translate`, here and nowhere else ---

    def call(
        self, conn: Connection, table: str, proc: Proc, args: Sequence[Any], *, fast: bool = False,
        alone: bool = False,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """Call a procedure on `conn` (inside the caller's transaction) and return its rows.

        `fast`: on the DBAPI cursor of `conn`, past SQLAlchemy's statement and result layers
        (the worker's hot path: claim_batch, hand_off); on a lost connection `conn` is
        invalidated, as SQLAlchemy would, so the next transaction opens a new one.

        `alone` (with `fast`): the caller's transaction holds this call and nothing else, so on
        PostgreSQL, when nothing has run in the transaction yet, the call runs as a statement of
        its own (autocommit for that statement: one round trip instead of BEGIN, the call,
        COMMIT; a function's statement is atomic, and its locks last until it ends, which is the
        transaction's end). The transaction's COMMIT then has nothing to do (psycopg sends
        nothing). On MySQL a CALL is not atomic by itself, so `alone` changes nothing there.

        On MySQL every call takes the DBAPI cursor, `fast` or not, and reads every result the
        CALL sends: its rows, then its status. An error can come with the status, after the rows
        (a deadlock or a Galera certification failure of a statement after the procedure's
        SELECT, which rolled the whole transaction back; a lock wait timeout, which undid only
        that statement). SQLAlchemy reads the status only when it closes the cursor and logs and
        drops an error it finds there ("Error closing cursor"): the caller would take the rows,
        COMMIT what is left and act on a claim or a result that is not in the database."""
        if len(args) != len(proc.params):
            raise TypeError(f"{proc.name} takes {len(proc.params)} arguments, got {len(args)}")
        key = (table, proc.name)
        statement = self._statements.get(key)
        if statement is None:
            statement = self._statements[key] = self.dialect.call_sql(table, proc)
        if not fast and self.dialect.name != "mysql":
            return self.rows(conn, statement, tuple(args))
        raw: Any = conn.connection.driver_connection
        single = alone and self.dialect.name == "postgres" and raw.info.transaction_status == _PG_IDLE
        try:
            if single:
                raw.autocommit = True
            try:
                cursor = raw.cursor()
                try:
                    cursor.execute(statement, tuple(args))
                    # A procedure's columns never change: read once (psycopg builds its
                    # description afresh, column by column, on each read).
                    names, values = self._columns.get(key), []
                    if cursor.description is not None:
                        if names is None:
                            names = self._columns[key] = [column[0] for column in cursor.description]
                        values = cursor.fetchall()
                    while cursor.nextset():  # the CALL's status: an error there raises here
                        pass
                    return [dict(zip(names, row, strict=True)) for row in values] if names else []
                finally:
                    cursor.close()
            finally:
                if single and not raw.closed:
                    raw.autocommit = False
        except self.driver_error as exc:
            error = self.translate(exc)
            if isinstance(error, DatabaseUnavailableError):
                self._say_reconnecting(error, exc)
                conn.invalidate()
            raise error from exc

    def rows(self, conn: Connection, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        """Run one statement (%s placeholders) on `conn`, in its transaction; its rows by column."""
        try:
            result = conn.exec_driver_sql(sql, _params(params))
            return [dict(row) for row in result.mappings().all()] if result.returns_rows else []
        except (sa.exc.DBAPIError, self.driver_error) as exc:
            raise self.translate(exc) from exc

    def tuples(self, conn: Connection, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        """`rows` as tuples straight from the driver (thousands of rows: no dict per row)."""
        try:
            result = conn.exec_driver_sql(sql, _params(params))
            return [tuple(row) for row in result.all()] if result.returns_rows else []
        except (sa.exc.DBAPIError, self.driver_error) as exc:
            raise self.translate(exc) from exc

    def scalar(self, conn: Connection, sql: str, params: Params = ()) -> Any:
        """The one value of a statement that returns one row of one column."""
        try:
            return conn.exec_driver_sql(sql, _params(params)).scalar_one()
        except (sa.exc.DBAPIError, self.driver_error) as exc:
            raise self.translate(exc) from exc

    def execute(self, conn: Connection, sql: str, params: Params = ()) -> int | None:
        """Run a statement that returns no rows; the cursor's lastrowid (MySQL's auto-increment)."""
        try:
            result = conn.exec_driver_sql(sql, _params(params))
            lastrowid: int | None = result.lastrowid if self.dialect.name == "mysql" else None
            return lastrowid
        except (sa.exc.DBAPIError, self.driver_error) as exc:
            raise self.translate(exc) from exc

    def execute_verbatim(
        self, conn: Connection, statements: Sequence[str], values: Sequence[Any] | None = None
    ) -> tuple[list[tuple[Any, ...]], int | None]:
        """Run `statements` on the DBAPI cursor of `conn`, in its transaction, as they are (no
        parameter markers: a '%' stays a '%'; install-procs' DDL); with `values`, the one
        statement's %s written in by the client first (MySQL's bulk INSERT, db/mysql.py inline).
        The last one's (rows, lastrowid)."""
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            rows: list[tuple[Any, ...]] = []
            for statement in statements:
                if values is not None:
                    from .mysql import inline

                    statement = inline(cursor.connection, statement, values)
                cursor.execute(statement)
                rows = list(cursor.fetchall()) if cursor.description is not None else []
            return rows, getattr(cursor, "lastrowid", None)
        except self.driver_error as exc:
            raise self.translate(exc) from exc
        finally:
            cursor.close()

    def detached(self) -> Any:
        """A new driver connection of the engine's (its session settings), in autocommit mode and
        detached from the pool: the caller's alone, who closes it (the MySQL Prober)."""
        try:
            raw = self.engine.raw_connection()
        except (sa.exc.DBAPIError, self.driver_error) as exc:
            raise self.translate(exc) from exc
        driver = raw.driver_connection
        assert driver is not None  # a fresh raw connection holds its driver connection
        raw.detach()  # this connection never goes back to the pool
        try:
            self.dialect.keep_autocommit(driver)
        except self.driver_error as exc:
            driver.close()
            raise self.translate(exc) from exc
        return driver

    @property
    def aio(self) -> AsyncPostgres:
        """The asyncio connections of `publish_async` (PostgreSQL; psycopg's asyncio side is
        loaded on first use)."""
        if self._aio is None:
            from .aio_postgres import AsyncPostgres

            self._aio = AsyncPostgres(self)
        return self._aio

    def execute_alone(self, sql: str, values: Sequence[Any]) -> tuple[list[tuple[Any, ...]], int | None]:
        """Run one statement in a transaction of its own, in one round trip, on a connection bgq
        keeps in autocommit mode (bgq/db/autocommit.py); return (its rows, the cursor's lastrowid).

        A connection lost after the statement was sent raises ConnectionLostError with
        `retryable` False (it may have committed); one found lost before is replaced silently."""
        return self.alone.execute(sql, values)

    def send_alone(self, sql: str, values: Sequence[Any]) -> Sent:
        """`execute_alone` without waiting for the server (where the dialect `can_send`): the
        statement goes out now and `Sent.rows()` reads its rows later (a bulk publish,
        meanwhile, validates its next batch). The errors are execute_alone's, raised here or by
        `rows()`."""
        return self.alone.send(sql, values)

    async def aclose(self) -> None:
        """Close the running event loop's asyncio connection (`aio`), if it has one."""
        if self._aio is not None:
            await self._aio.aclose()

    def insert_returning(self) -> bool:
        """Whether the server's INSERT takes RETURNING (PostgreSQL, MariaDB 10.5+; not MySQL 8),
        learnt on the engine's first connection."""
        dialect = self.engine.dialect
        if dialect.server_version_info is None:
            try:
                with self.engine.connect():
                    pass
            except (sa.exc.DBAPIError, self.driver_error) as exc:
                raise self.translate(exc) from exc
        return bool(dialect.insert_returning)

    def listener_connect(self) -> Any:
        """A new psycopg connection in autocommit mode for LISTEN: to `listen_url` when set, else
        to `url` (PostgreSQL only; the caller closes it). Never from the engine's pool."""
        url = self.listen_url or self.url
        args, kwargs = self.engine.dialect.create_connect_args(url)
        import psycopg

        try:
            return psycopg.connect(*args, **{**kwargs, "autocommit": True})
        except psycopg.Error as exc:
            raise self.translate(exc) from exc

    def dispose(self) -> None:
        self.alone.close()
        self.engine.dispose()
