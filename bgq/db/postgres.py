"""PostgreSQL (psycopg 3): SELECT-from-function syntax with typed parameters, and SQLSTATEs."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import re
import select
import weakref
from collections.abc import Sequence
from typing import Any

import psycopg
from sqlalchemy.engine import Connection

from ..errors import (
    BgqError,
    ConnectionLostError,
    DatabaseError,
    DatabaseUnavailableError,
    DeadlockError,
    JobNotFoundError,
    JobStateError,
    LockTimeoutError,
    PacketTooLargeError,
    ReadOnlyError,
    SchemaVersionError,
    SerializationFailureError,
    StatementCanceledError,
)
from ..model import NewJob
from .dialect import InstalledRoutine, InstallLockSql, Proc

# SQLSTATEs the functions RAISE (db/postgres/*.sql headers).
_BGQ_ERRORS: dict[str, type[BgqError]] = {
    "BQ001": JobNotFoundError,
    "BQ002": DatabaseError,
    "BQ003": JobStateError,
}
_NOT_INSTALLED = {"42P01", "42883"}  # undefined table; undefined function
# The server's SQLSTATEs, by what they mean for bgq; any other class 08 state is a lost connection.
SERVER_ERRORS: dict[str, type[DatabaseError]] = {
    "55P03": LockTimeoutError,  # lock_not_available (lock_timeout, NOWAIT)
    "40P01": DeadlockError,  # deadlock_detected
    "40001": SerializationFailureError,  # serialization_failure
    "57014": StatementCanceledError,  # query_canceled (statement_timeout, pg_cancel_backend)
    "54000": PacketTooLargeError,  # program_limit_exceeded
    "08001": DatabaseUnavailableError,  # sqlclient_unable_to_establish_sqlconnection
    "08004": DatabaseUnavailableError,  # sqlserver_rejected_establishment_of_sqlconnection
    "57P03": DatabaseUnavailableError,  # cannot_connect_now (starting up, shutting down)
    "57P01": ConnectionLostError,  # admin_shutdown (pg_terminate_backend, smart/fast shutdown)
    "57P02": ConnectionLostError,  # crash_shutdown
    "25P03": ConnectionLostError,  # idle_in_transaction_session_timeout
    "25006": ReadOnlyError,  # read_only_sql_transaction (a hot standby, default_transaction_read_only)
}
_CONNECTION_CLASS = "08"
_IDLE = psycopg.pq.TransactionStatus.IDLE
_FATAL_ERROR = psycopg.pq.ExecStatus.FATAL_ERROR
_SQLSTATE = psycopg.pq.DiagnosticField.SQLSTATE
#: A round trip that proves a connection alive (publish_async's ping of an idle connection).
PING_SQL = "SELECT 1"


class PostgresDialect:
    name = "postgres"
    can_send = True

    def __init__(self) -> None:
        # The statements `send` prepared on each connection (by name): a connection that closes
        # leaves with its own.
        self._prepared: weakref.WeakKeyDictionary[Any, set[bytes]] = weakref.WeakKeyDictionary()

    def call_sql(self, table: str, proc: Proc) -> str:
        # Explicit casts: psycopg sends Python ints as int2/int4/int8 by size, and a function
        # parameter does not accept a wider integer type implicitly.
        args = ", ".join(f"%s::{pg_type}" for _, pg_type in proc.params)
        if proc.function:
            return f"SELECT {table}_{proc.name}({args}) AS result"
        return f"SELECT * FROM {table}_{proc.name}({args})"

    def now_sql(self) -> str:
        return "statement_timestamp()"  # one reading per statement, like MySQL's UTC_TIMESTAMP(6)

    def drop_sql(self, table: str, name: str, function: bool) -> str:
        return f"DROP FUNCTION IF EXISTS {table}_{name}"

    def routines(self, conn: Connection, names: Sequence[str]) -> list[InstalledRoutine]:
        # proargmodes is NULL when every argument is IN; 'i' in, 'b' inout, 'v' variadic,
        # 'o' out, 't' a RETURNS TABLE column.
        rows = conn.exec_driver_sql(
            "SELECT p.proname AS name, p.proargnames::text[] AS arg_names,"
            " p.proargmodes::text[] AS arg_modes,"
            " pg_get_function_arguments(p.oid) AS arguments,"
            " md5(pg_get_functiondef(p.oid)) AS definition_digest"
            " FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace"
            " WHERE n.nspname = current_schema() AND p.proname = ANY(%s)",
            (list(names),),
        ).all()
        out = []
        for name, arg_names, arg_modes, arguments, digest in rows:
            arg_names = arg_names or []
            modes = arg_modes or ["i"] * len(arg_names)
            inputs = tuple(n for n, m in zip(arg_names, modes, strict=True) if m in ("i", "b", "v"))
            out.append(InstalledRoutine(name, inputs, f"FUNCTION ({arguments})", digest))
        return out

    def translate(self, exc: BaseException) -> BgqError | None:
        state = getattr(exc, "sqlstate", None)
        if state in _BGQ_ERRORS:
            diag = getattr(exc, "diag", None)
            message = getattr(diag, "message_primary", None) or str(exc)
            return _BGQ_ERRORS[state](message)
        if state in _NOT_INSTALLED:
            return SchemaVersionError(
                f"bgq is not installed for this table ({exc}): run `bgq install-procs`."
            )
        kind = SERVER_ERRORS.get(state) if state else None
        if kind is None and state and state.startswith(_CONNECTION_CLASS):
            kind = ConnectionLostError
        if kind is None and state is None and isinstance(exc, psycopg.OperationalError):
            # psycopg's own connection errors carry no SQLSTATE; a failed connection attempt
            # carries the attempt's pgconn, a connection that broke later does not.
            kind = DatabaseUnavailableError if exc.pgconn is not None else ConnectionLostError
        if kind is None:
            return None
        detail = " ".join(str(exc).split())  # one line in a log (libpq's messages span lines)
        if kind is ReadOnlyError:  # the message alone: its CONTEXT lines name bgq's own SQL
            detail = getattr(getattr(exc, "diag", None), "message_primary", None) or detail
        return kind(f"{(kind.__doc__ or '').strip().rstrip('.')}: {detail}")

    def session_sql(self, dbapi_connection: Any, seconds: int) -> list[str]:
        ms = int(seconds) * 1000
        return [f"SET lock_timeout = {ms}", f"SET idle_in_transaction_session_timeout = {ms}"]

    def transaction_sql(self, seconds: int) -> str:
        """session_sql's bounds for the current transaction only (set_config(..., true) is SET
        LOCAL), in one statement: what a transaction pooler's server connection may carry."""
        ms = int(seconds) * 1000
        return (
            f"SELECT set_config('lock_timeout', '{ms}', true),"
            f" set_config('idle_in_transaction_session_timeout', '{ms}', true)"
        )

    def causal_sync(self, dbapi_connection: Any) -> str | None:
        """None: a primary's reads see every commit (a standby is read-only for bgq)."""
        return None

    def keep_autocommit(self, dbapi_connection: Any) -> int:
        dbapi_connection.rollback()  # the pool hands connections over idle: make sure of it
        dbapi_connection.autocommit = True
        return int(dbapi_connection.fileno())

    def idle_outside_transaction(self, dbapi_connection: Any) -> bool:
        return not dbapi_connection.closed and dbapi_connection.info.transaction_status == _IDLE

    def send(self, dbapi_connection: Any, sql: str, values: Sequence[Any]) -> None:
        """Send `sql` (%s placeholders; values str, int, datetime or None) with libpq's
        PQsendQueryPrepared, the extended protocol's Bind, Execute and Sync, and return once it
        is all on the wire: on an autocommit connection the server runs and commits it by itself
        while the caller works; `read` waits for the outcome. psycopg's execute() sends the same
        messages and then waits; its pipeline mode would need a BEGIN and a COMMIT around the
        statement. The statement is prepared once per connection (one round trip), as psycopg
        prepares those it runs often, unless the connection's prepare_threshold is None."""
        pgconn = dbapi_connection.pgconn
        encoding = dbapi_connection.info.encoding
        params = [_text(v, encoding) for v in values]
        if dbapi_connection.prepare_threshold is None:
            pgconn.send_query_params(_numbered(sql).encode(encoding), params)
        else:
            prepared = self._prepared.setdefault(dbapi_connection, set())
            name = _statement_name(sql)
            if name not in prepared:
                pgconn.send_prepare(name, _numbered(sql).encode(encoding))
                _flush(pgconn)
                for result in _results(pgconn):
                    _check(result, encoding)
                prepared.add(name)
            pgconn.send_query_prepared(name, params)
        _flush(pgconn)

    def read(self, dbapi_connection: Any) -> list[tuple[Any, ...]]:
        """The rows of the statement `send` sent, once the server has run it, each value as the
        server's text (bytes; None for NULL); its error as psycopg raises it (the SQLSTATE's class)."""
        encoding = dbapi_connection.info.encoding
        rows: list[tuple[Any, ...]] = []
        for result in _results(dbapi_connection.pgconn):
            _check(result, encoding)
            value, columns = result.get_value, range(result.nfields)
            rows += [tuple([value(r, c) for c in columns]) for r in range(result.ntuples)]
        return rows

    def table_exists_sql(self) -> str:
        return (
            # The table is created by an unquoted name, which PostgreSQL folds to lower case.
            "SELECT COUNT(*) FROM pg_catalog.pg_tables"
            " WHERE schemaname = current_schema() AND tablename = lower(%s)"
        )

    def install_lock_sql(self) -> InstallLockSql:
        """A transaction-scoped advisory lock (released by the COMMIT or ROLLBACK of install-procs'
        one transaction, so no session keeps it, whatever pooler is in between), per database:
        the pair of int4 keys is (a constant for "bgq install", the table's hash); a collision
        only makes two installs wait for each other."""
        keys = "hashtext('bgq install'), hashtext(lower(%(table)s))"  # one table, whatever the case
        return InstallLockSql(
            setup=(), take=(f"SELECT pg_try_advisory_xact_lock({keys})",), release="", in_transaction=True
        )


@functools.lru_cache(maxsize=16)
def _numbered(sql: str) -> str:
    """`sql` with libpq's $1, $2, ... for its %s placeholders (and % for %%)."""
    numbers = iter(range(1, sql.count("%s") + 1))
    return re.sub("%[s%]", lambda m: f"${next(numbers)}" if m.group() == "%s" else "%", sql)


@functools.lru_cache(maxsize=16)
def _statement_name(sql: str) -> bytes:
    """The name `send` prepares `sql` under (psycopg names its own _pg3_N)."""
    return b"bgq_" + hashlib.sha1(sql.encode()).hexdigest()[:20].encode()


def _flush(pgconn: Any) -> None:
    """Wait until libpq has written all it holds (a non-blocking connection writes what the
    socket takes at once)."""
    while pgconn.flush():
        _wait(pgconn.socket, select.POLLOUT)


def _results(pgconn: Any) -> list[Any]:
    """Every result of the command in progress, waiting for the server as long as it takes."""
    results: list[Any] = []
    while True:
        while pgconn.is_busy():
            _wait(pgconn.socket, select.POLLIN)
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            return results
        results.append(result)


def _wait(fd: int, event: int) -> None:
    poller = select.poll()  # not select.select: a descriptor above 1023 is fine
    poller.register(fd, event)
    poller.poll()


def _check(result: Any, encoding: str) -> None:
    """Raise a failed result's error as psycopg would: the class of its SQLSTATE."""
    if result.status == _FATAL_ERROR:
        state = (result.error_field(_SQLSTATE) or b"").decode()
        try:
            kind: type[psycopg.Error] = psycopg.errors.lookup(state)
        except KeyError:
            kind = psycopg.DatabaseError
        raise kind((result.error_message or b"").decode(encoding, "replace"), info=result)


def _text(value: Any, encoding: str) -> bytes | None:
    """A parameter in PostgreSQL's text input format (the statement's casts give its type)."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.isoformat().encode()
    if isinstance(value, str | int):
        return str(value).encode(encoding)
    raise TypeError(f"send() takes str, int, datetime or None parameters, not {type(value).__name__}")


def insert_many_sql(table: str, columns: Sequence[str], now: str) -> str:
    """The bulk INSERT of publish: one array per column that varies (insert_many_arrays),
    unnested in order, then `now` for created_at and updated_at; it returns the new ids."""
    return (
        f"INSERT INTO {table} ({', '.join(columns)}, created_at, updated_at)"
        f" SELECT q, p, c, pk, pj::json, 1, 0, g, t, i, m, pb, b, {now}, {now}"
        " FROM unnest(%s::varchar[], %s::integer[], %s::varchar[], %s::bytea[], %s::text[],"
        " %s::varchar[], %s::bigint[], %s::varchar[], %s::varchar[], %s::integer[], %s::smallint[])"
        " WITH ORDINALITY AS j(q, p, c, pk, pj, g, t, i, m, pb, b, n) ORDER BY n RETURNING id"
    )


def insert_many_arrays(jobs: Sequence[NewJob]) -> tuple[str, ...]:
    """The 11 arrays of insert_many_sql for `jobs`, whatever their number, as array input."""
    rows = [
        (
            j.queue,
            j.priority,
            j.callback_name,
            None if j.parameters is None else "\\x" + j.parameters.hex(),  # bytea's hex input
            j.parameters_json,
            j.serial_group,
            j.coalesce_threshold,
            j.identifier,
            j.mode,
            j.postponed_by,
            int(j.processed_by_broker),
        )
        for j in jobs
    ]
    columns = zip(*rows, strict=True)
    return tuple(_pg_array(list(column), text) for column, text in zip(columns, _TEXT_ARRAYS, strict=True))


_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_CONTROL = re.compile(r"[\x00-\x1f]")
#: Which of insert_many_arrays' arrays hold text (the others: integers).
_TEXT_ARRAYS = (True, False, True, True, True, True, False, True, True, False, False)


def _pg_array(column: list[Any], text: bool) -> str:
    """A column of str or int (`text` says which) and None as PostgreSQL array input, written by
    the C JSON encoder (psycopg dumps a list element by element, ~15 times slower): a JSON
    string's quoting ("..." escaping only \\ and \") is the array input's, null is NULL, and
    only the outer brackets differ. JSON writes a control character as \\n or \\u00XX, which
    array input would read differently: a column holding one is quoted here, element by element
    (inside double quotes array input takes every character but \\ and \" as it is)."""
    if text and _CONTROL.search("".join(filter(None, column))):
        return "{" + ",".join("NULL" if v is None else _quoted(v) for v in column) + "}"
    return "{" + _JSON.encode(column)[1:-1] + "}"


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
