"""The database seam: one engine per queue, explicit transactions, dialect-specific call syntax."""

from __future__ import annotations

import inspect
import logging
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, unquote

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
from .alone import Alone, Sent
from .dialect import Dialect, InstalledRoutine, Proc

__all__ = [
    "Database", "Dialect", "InstalledRoutine", "Proc", "Sent", "dialect_for", "dialect_name", "normalise_url",
]  # fmt: skip


def dialect_name(backend: str) -> str | None:
    """bgq's name ("mysql" or "postgres") for a SQLAlchemy backend name, or None if unsupported."""
    if backend in ("mysql", "mariadb"):
        return "mysql"
    if backend in ("postgresql", "postgres"):
        return "postgres"
    return None


def dialect_for(url: sa.URL) -> Dialect:
    name = dialect_name(url.get_backend_name())
    if name == "mysql":
        from .mysql import MySQLDialect

        return MySQLDialect()
    if name == "postgres":
        from .postgres import PostgresDialect

        return PostgresDialect()
    raise _unsupported(url.get_backend_name())


def _unsupported(backend: str) -> DatabaseError:
    return DatabaseError(f"Unsupported database {backend!r}: use mysql+pymysql:// or postgresql+psycopg://.")


def normalise_url(raw: str) -> sa.URL:
    """Parse a database URL and pick bgq's drivers when none is named (`postgres://` and
    `postgresql://` become postgresql+psycopg, `mysql://` and `mariadb://` +pymysql). A URL that
    does not parse or names another database raises DatabaseError, before anything connects."""
    try:
        url = sa.make_url(_hosts_to_query(raw))
    except Exception as exc:  # sqlalchemy raises ArgumentError with the URL in it
        raise DatabaseError(f"Invalid database URL: {exc}") from None
    # The driver is read off the URL's text: SQLAlchemy's get_driver_name() loads the dialect,
    # which fails for names it does not know, such as the common "postgres://".
    backend, _, driver = url.drivername.partition("+")
    name = dialect_name(backend)
    if name is None:
        raise _unsupported(backend)
    if name == "mysql" and driver != "pymysql":
        url = url.set(drivername=f"{backend}+pymysql")
    elif name == "postgres" and driver != "psycopg":
        url = url.set(drivername="postgresql+psycopg")
    return url


#: A libpq multi-host URI: scheme://[userinfo@]host1[:port1],host2[:port2].../rest.
_MULTI_HOST = re.compile(
    r"^(?P<scheme>postgres(?:ql)?(?:\+\w+)?)://(?:(?P<auth>[^@/?]*)@)?(?P<hosts>[^/?@]*,[^/?@]*)(?P<rest>[/?].*)?$"
)


def _hosts_to_query(raw: str) -> str:
    """libpq's multi-host URI, `postgresql://u@h1:p1,h2:p2/db?...`, in the form SQLAlchemy
    parses (its URL has one host and one port): `postgresql://u@/db?host=h1:p1&host=h2:p2&...`,
    which its psycopg dialect hands to libpq as host=h1,h2 port=p1,p2. Any other URL as it is."""
    m = _MULTI_HOST.match(raw.strip())
    if m is None:
        return raw
    hosts = [h.strip() for h in m["hosts"].split(",") if h.strip()]
    rest = m["rest"] or "/"
    path, _, query = rest.partition("?")
    params = "&".join(f"host={quote(h, safe='[]:')}" for h in hosts)
    auth = f"{m['auth']}@" if m["auth"] is not None else ""
    return f"{m['scheme']}://{auth}{path or '/'}?{params}{'&' + query if query else ''}"


def render_url(url: sa.URL) -> str:
    """`url` as people read it, the password hidden: a multi-host URL's `host=h:p` unquoted."""
    return unquote(url.render_as_string(hide_password=True))


def _check_url_options(engine: sa.Engine) -> None:
    """Refuse, before anything connects, a URL option the driver's connect() does not take (a
    typo in `?conect_timeout=5` on MySQL would fail inside every connection attempt as a TypeError).
    psycopg hands unknown options to libpq, which names them itself."""
    cargs, cparams = engine.dialect.create_connect_args(engine.url)
    try:
        inspect.signature(engine.dialect.loaded_dbapi.connect).bind(*cargs, **cparams)
    except TypeError as exc:
        raise DatabaseError(f"Invalid database URL: {engine.dialect.driver}.connect() {exc}.") from None


def _one_line(exc: BaseException) -> str:
    """A driver error's message on one line (psycopg's carry a second line of context)."""
    return " ".join(str(exc).split())


#: Default of the Queue option `lock_timeout`, in seconds.
LOCK_TIMEOUT = 5
#: The engine's pool: connections kept idle, and opened beyond them at most; the same bounds for
#: the single-statement connections (bgq/db/alone.py), a second set beside the pool.
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
            self.log.warning(
                f"bgq: The database node is not ready (Galera: not Synced); reconnecting. ({orig})"
            )
            return
        if isinstance(error, ReadOnlyError):
            context.is_disconnect = True  # (the caller logs the ReadOnlyError, once)
            return
        if context.is_disconnect:
            self.log.critical(
                "bgq: The database connection was lost; reconnecting."
                f" ({_one_line(context.original_exception)})"
            )

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

    def call(self, conn: Connection, table: str, proc: Proc, args: Sequence[Any]) -> list[dict[str, Any]]:
        """Call a procedure on `conn` (inside the caller's transaction) and return its rows."""
        if len(args) != len(proc.params):
            raise TypeError(f"{proc.name} takes {len(proc.params)} arguments, got {len(args)}")
        result = conn.exec_driver_sql(self.dialect.call_sql(table, proc), tuple(args))
        if not result.returns_rows:
            return []
        return [dict(row) for row in result.mappings().all()]

    def execute_alone(self, sql: str, values: Sequence[Any]) -> tuple[list[tuple[Any, ...]], int | None]:
        """Run one statement in a transaction of its own, in one round trip, on a connection bgq
        keeps in autocommit mode (bgq/db/alone.py); return (its rows, the cursor's lastrowid).

        A connection lost after the statement was sent raises ConnectionLostError with
        `retryable` False (it may have committed); one found lost before is replaced silently."""
        return self.alone.execute(sql, values)

    def send_alone(self, sql: str, values: Sequence[Any]) -> Sent:
        """`execute_alone` without waiting for the server (where the dialect `can_send`): the
        statement goes out now and `Sent.rows()` reads its rows later (a bulk publish,
        meanwhile, validates its next batch). The errors are execute_alone's, raised here or by
        `rows()`."""
        return self.alone.send(sql, values)

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
