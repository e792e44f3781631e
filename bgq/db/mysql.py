"""MySQL 8 / MariaDB 10.11 (pymysql): CALL syntax, schema splitting and error codes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pymysql
from pymysql.constants import COMMAND
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
    NodeNotReadyError,
    PacketTooLargeError,
    ReadOnlyError,
    SchemaVersionError,
    SerializationError,
    SerializationFailureError,
    StatementCanceledError,
)
from .dialect import InstalledRoutine, InstallLockSql, Proc

# MYSQL_ERRNO values the procedures SIGNAL (db/mysql/*.sql headers).
_BGQ_ERRORS: dict[int, type[BgqError]] = {31001: JobNotFoundError, 31002: DatabaseError, 31003: JobStateError}
_NOT_INSTALLED = {1146, 1305}  # no such table; no such procedure or function
# Parameters the server's JSON refuses: MariaDB's JSON column is a JSON_VALID check (4025,
# ER_CONSTRAINT_FAILED, at 32 levels of nesting); MySQL 8's JSON type says 3157 (over 100 levels).
_JSON_REFUSED = {4025, 3157}
# The server's and the client's own error numbers, by what they mean for bgq.
SERVER_ERRORS: dict[int, type[DatabaseError]] = {
    1205: LockTimeoutError,  # ER_LOCK_WAIT_TIMEOUT (innodb_lock_wait_timeout)
    3572: LockTimeoutError,  # ER_LOCK_NOWAIT (MySQL 8: NOWAIT found a lock)
    1213: DeadlockError,  # ER_LOCK_DEADLOCK; on Galera also a failed certification at COMMIT
    1047: NodeNotReadyError,  # ER_UNKNOWN_COM_ERROR: "WSREP has not yet prepared node for application use"
    # ER_ERROR_DURING_COMMIT: the commit failed and was rolled back; on Galera "... (provider status:
    # Not connected to Primary Component)", a node cut off from the cluster's quorum.
    1180: NodeNotReadyError,
    1020: SerializationFailureError,  # ER_CHECKREAD (MariaDB innodb_snapshot_isolation)
    1153: PacketTooLargeError,  # ER_NET_PACKET_TOO_LARGE (max_allowed_packet)
    2020: PacketTooLargeError,  # CR_NET_PACKET_TOO_LARGE (client side)
    1317: StatementCanceledError,  # ER_QUERY_INTERRUPTED (KILL QUERY)
    1969: StatementCanceledError,  # ER_STATEMENT_TIMEOUT (MariaDB max_statement_time)
    3024: StatementCanceledError,  # ER_QUERY_TIMEOUT (MySQL 8 max_execution_time)
    2003: DatabaseUnavailableError,  # CR_CONN_HOST_ERROR: cannot connect
    2005: DatabaseUnavailableError,  # CR_UNKNOWN_HOST
    1040: DatabaseUnavailableError,  # ER_CON_COUNT_ERROR: too many connections
    1044: DatabaseUnavailableError,  # ER_DBACCESS_DENIED_ERROR: the user may not use the database
    1045: DatabaseUnavailableError,  # ER_ACCESS_DENIED_ERROR: wrong user or password
    1049: DatabaseUnavailableError,  # ER_BAD_DB_ERROR: no such database (PostgreSQL: the same)
    2006: ConnectionLostError,  # CR_SERVER_GONE_ERROR
    2013: ConnectionLostError,  # CR_SERVER_LOST (during a query)
    2055: ConnectionLostError,  # CR_SERVER_LOST_EXTENDED
    1053: ConnectionLostError,  # ER_SERVER_SHUTDOWN
    1927: ConnectionLostError,  # ER_CONNECTION_KILLED (MariaDB: KILL of this session)
    4031: ConnectionLostError,  # disconnected for inactivity (MariaDB idle_transaction_timeout, MySQL 8)
    1290: ReadOnlyError,  # ER_OPTION_PREVENTS_STATEMENT (--read-only, --super-read-only: a replica)
    1792: ReadOnlyError,  # ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
}


class MySQLDialect:
    name = "mysql"
    can_send = True  # PyMySQLInternals; tests/test_private_apis.py fails if PyMySQL moves them

    def call_sql(self, table: str, proc: Proc) -> str:
        marks = ", ".join(["%s"] * len(proc.params))
        verb = "SELECT" if proc.function else "CALL"
        return f"{verb} {table}_{proc.name}({marks})"

    def now_sql(self) -> str:
        return "UTC_TIMESTAMP(6)"

    def drop_sql(self, table: str, name: str, function: bool) -> str:
        return f"DROP {'FUNCTION' if function else 'PROCEDURE'} IF EXISTS {table}_{name}"

    def routines(self, conn: Connection, names: Sequence[str]) -> list[InstalledRoutine]:
        # Two plain reads joined here: a correlated subquery on information_schema.PARAMETERS
        # (per routine) costs MariaDB ~70 ms with a hundred routines in the schema, these ~4 ms,
        # and every process's first call runs this check. Parameters with ORDINAL_POSITION 0 are
        # a function's return value. ROUTINE_DEFINITION is NULL for a user who neither created
        # the routine nor may read routines' code.
        marks = ", ".join(["%s"] * len(names))
        rows = conn.exec_driver_sql(
            "SELECT LOWER(r.ROUTINE_NAME) AS name, r.ROUTINE_TYPE AS kind,"
            " MD5(r.ROUTINE_DEFINITION) AS definition_digest"
            " FROM information_schema.ROUTINES AS r"
            f" WHERE r.ROUTINE_SCHEMA = DATABASE() AND LOWER(r.ROUTINE_NAME) IN ({marks})",
            tuple(names),
        ).all()
        parameters: dict[str, list[tuple[str, str, str]]] = {}  # routine -> (mode, name, type)
        for routine, mode, name, declared in conn.exec_driver_sql(
            "SELECT LOWER(p.SPECIFIC_NAME), p.PARAMETER_MODE, p.PARAMETER_NAME, p.DTD_IDENTIFIER"
            " FROM information_schema.PARAMETERS AS p"
            f" WHERE p.SPECIFIC_SCHEMA = DATABASE() AND LOWER(p.SPECIFIC_NAME) IN ({marks})"
            " AND p.ORDINAL_POSITION > 0 ORDER BY p.SPECIFIC_NAME, p.ORDINAL_POSITION",
            tuple(names),
        ):
            if mode is not None and name is not None and declared is not None:
                parameters.setdefault(routine, []).append((mode, name, declared))
        out = []
        for name, kind, digest in rows:
            params = parameters.get(name, [])
            arguments = "; ".join(" ".join(p) for p in params)
            out.append(
                InstalledRoutine(
                    name=name,
                    inputs=tuple(param for mode, param, _ in params if mode == "IN"),
                    signature=f"{kind} ({arguments})",
                    definition_digest=digest,
                )
            )
        return out

    def translate(self, exc: BaseException) -> BgqError | None:
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        if code in _BGQ_ERRORS:
            message = exc.args[1] if len(exc.args) > 1 else str(exc)
            return _BGQ_ERRORS[code](str(message))
        if code in _JSON_REFUSED and (code == 3157 or "parameters_json" in str(exc)):
            return SerializationError(
                "The server refused the parameters as JSON (MariaDB nests JSON at most 31 levels "
                f"deep, MySQL 8 at most 100): {exc.args[-1]}"
            )
        if code in _NOT_INSTALLED:
            return SchemaVersionError(
                f"bgq is not installed for this table ({exc.args[-1]}): run `bgq install-procs`."
            )
        kind = SERVER_ERRORS.get(code) if code is not None else None
        if kind is None and isinstance(exc, pymysql.err.InterfaceError):
            kind = ConnectionLostError  # pymysql's "(0, '')": the socket is already closed
        if kind is None:
            return None
        return kind(f"{(kind.__doc__ or '').strip().rstrip('.')}: {exc}")

    def session_sql(self, dbapi_connection: Any, seconds: int) -> list[str]:
        """innodb_lock_wait_timeout on every server; idle_transaction_timeout on MariaDB (10.3+).

        MySQL 8 has no idle-in-transaction timeout: there a frozen session keeps its locks until
        the server's `wait_timeout` (default 8 hours) ends it, though nobody waits for them longer
        than `seconds`. Give bgq's database user a short `wait_timeout` on MySQL 8 (bgq's pool
        pings and replaces connections the server closed) to bound it.
        """
        statements = [f"SET SESSION innodb_lock_wait_timeout = {int(seconds)}"]
        if "mariadb" in str(dbapi_connection.get_server_info()).lower():
            statements.append(f"SET SESSION idle_transaction_timeout = {int(seconds)}")
        return statements

    def causal_sync(self, dbapi_connection: Any) -> str | None:
        """Galera (wsrep_on): a commit returns once the cluster has certified it, but the other
        nodes apply it a little later, so a transaction that haproxy (or a pool) puts on another
        node may read the rows as they were before it: a worker's result write would find its own
        claim missing and drop the result as "taken over", and the job would run again after the
        reaper's timeout. `wsrep_sync_wait = 1` makes a SELECT that opens a transaction wait
        until the node has applied everything certified before it (a CALL never waits, so bgq
        sends `SELECT 1` first). A plain server says wsrep_on = 0; MySQL 8 has no such variable
        (Percona XtraDB Cluster has both, as MariaDB)."""
        cursor = dbapi_connection.cursor()
        try:
            try:
                cursor.execute("SELECT @@wsrep_on")
                row = cursor.fetchone()
            except pymysql.err.MySQLError:  # 1193 unknown system variable: not a Galera build
                row = None
            on = row is not None and str(row[0]).upper() in ("1", "ON")
            if on:
                cursor.execute("SET SESSION wsrep_sync_wait = 1")
        finally:
            cursor.close()
        dbapi_connection.commit()  # the SELECT opened a transaction: the first one must be ours
        return "SELECT 1" if on else None

    def keep_autocommit(self, dbapi_connection: Any) -> int:
        dbapi_connection.autocommit(True)
        return PyMySQLInternals(dbapi_connection).fileno()

    def send(self, dbapi_connection: Any, sql: str, values: Sequence[Any]) -> None:
        """Write `sql` with its values (inline) as one COM_QUERY and return without reading the
        reply: on an autocommit connection the server runs and commits it meanwhile, and `read`
        reads the reply. PyMySQL's cursor does both in execute() (PyMySQLInternals)."""
        PyMySQLInternals(dbapi_connection).send_query(inline(dbapi_connection, sql, values))

    def read(self, dbapi_connection: Any) -> list[tuple[Any, ...]]:
        """The rows of the statement `send` wrote (as PyMySQL converts them), or its error."""
        return PyMySQLInternals(dbapi_connection).read_rows()

    def idle_outside_transaction(self, dbapi_connection: Any) -> bool:
        """Open (autocommit on: PyMySQL has no transaction status; a broken one is closed)."""
        return bool(dbapi_connection.open)

    def table_exists_sql(self) -> str:
        return (
            "SELECT COUNT(*) FROM information_schema.tables"
            " WHERE table_schema = DATABASE() AND table_name = %s"
        )

    def transaction_sql(self, seconds: int) -> str:
        raise NotImplementedError("bgq has no pooled mode on MySQL")

    def install_lock_sql(self) -> InstallLockSql:
        """A lock row in `bgq_install_lock` (one per jobs table of the database), not GET_LOCK:
        GET_LOCK holds on one server only, and on a Galera cluster two installs on two nodes
        would both get it. The row is written by a committed INSERT, so a second node sees it
        (or fails certification on it, 1213, and tries again). A killed install cannot release
        it: the row is a lease of %(lease)s seconds that the install refreshes while it runs, so
        the next one takes over after it expired."""
        now = "UTC_TIMESTAMP(6)"
        expired = f"expires_at < {now}"
        return InstallLockSql(
            setup=(
                "CREATE TABLE IF NOT EXISTS bgq_install_lock ("
                " name VARCHAR(64) NOT NULL, holder VARCHAR(255) NOT NULL,"
                " taken_at DATETIME(6) NOT NULL, expires_at DATETIME(6) NOT NULL,"
                " PRIMARY KEY (name)) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4",
            ),
            take=(
                "INSERT INTO bgq_install_lock (name, holder, taken_at, expires_at)"
                f" VALUES (%(table)s, %(holder)s, {now}, {now} + INTERVAL %(lease)s SECOND)"
                f" ON DUPLICATE KEY UPDATE holder = IF({expired}, VALUES(holder), holder),"
                f" taken_at = IF({expired}, VALUES(taken_at), taken_at),"
                f" expires_at = IF({expired}, VALUES(expires_at), expires_at)",
                "SELECT COUNT(*) FROM bgq_install_lock WHERE name = %(table)s AND holder = %(holder)s",
            ),
            release="DELETE FROM bgq_install_lock WHERE name = %(table)s AND holder = %(holder)s",
            refresh=(
                f"UPDATE bgq_install_lock SET expires_at = {now} + INTERVAL %(lease)s SECOND"
                " WHERE name = %(table)s AND holder = %(holder)s"
            ),
        )


class PyMySQLInternals:
    """The one place bgq touches PyMySQL's private API, on purpose: PyMySQL has no public way
    to send a statement and read its reply later (its `query()` does both at once; a thread per
    statement would be the only public alternative, a second concurrency mechanism for one
    optimisation: a bulk publish that validates its next batch while the server inserts this
    one), nor to reach a connection's socket (Alone polls it to see a server's goodbye without
    a round trip). Each name here is in PyMySQL since 0.x, through 1.x and 2.x;
    tests/test_private_apis.py fails loudly the day one is renamed or changes its shape."""

    #: The private attributes used, checked by the test against the installed PyMySQL.
    NAMES = ("_execute_command", "_read_query_result", "_result", "_sock")

    def __init__(self, dbapi_connection: Any) -> None:
        self._conn = dbapi_connection

    def fileno(self) -> int:
        """The file descriptor of the connection's socket."""
        return int(self._conn._sock.fileno())

    def send_query(self, sql: str) -> None:
        """The first half of Cursor.execute: write `sql` as one COM_QUERY, read nothing."""
        self._conn._execute_command(COMMAND.COM_QUERY, sql)

    def read_rows(self) -> list[tuple[Any, ...]]:
        """The second half: read the reply of the statement sent (its rows, or its error)."""
        self._conn._read_query_result()
        return list(self._conn._result.rows or ())


#: MySQL 8's bulk INSERT without RETURNING: the auto-increment settings that say whether one
#: INSERT ... VALUES gets consecutive ids (consecutive_ids).
AUTOINC_SQL = "SELECT @@innodb_autoinc_lock_mode, @@auto_increment_increment"


def consecutive_ids(lock_mode: Any, increment: Any) -> int | None:
    """The step between the ids of one multi-row INSERT ... VALUES (InnoDB gives them
    consecutively, stepping by auto_increment_increment, under innodb_autoinc_lock_mode 0 or 1),
    or None under 2 (interleaved), where they need not be consecutive."""
    return None if int(lock_mode) == 2 else int(increment)


def values_sql(table: str, columns: Sequence[str], count: int, now: str, returning: str) -> str:
    """The bulk INSERT ... VALUES: a row of %s per column (then `now` for created_at and
    updated_at) for each of `count` jobs, and `returning` (MariaDB: " RETURNING id")."""
    row = "(" + ", ".join(["%s"] * len(columns)) + f", {now}, {now})"
    return (
        f"INSERT INTO {table} ({', '.join(columns)}, created_at, updated_at) VALUES "
        + ", ".join([row] * count)
        + returning
    )


def inline(dbapi_connection: Any, sql: str, values: Sequence[Any]) -> str:
    """`sql` with `values` written in for its %s placeholders, as PyMySQL's cursor would write
    them, only faster for a bulk INSERT's thousands: an int as its digits, None as NULL, and
    every other value escaped by the connection (its NO_BACKSLASH_ESCAPES mode included) once
    per distinct value (a batch repeats its queue, callback and mode in every row)."""
    escape = dbapi_connection.escape
    escaped: dict[Any, str] = {}
    literals = []
    for value in values:
        if type(value) is int:
            literals.append(str(value))
        elif value is None:
            literals.append("NULL")
        else:
            literal = escaped.get(value)
            if literal is None:
                literal = escaped[value] = escape(value)
            literals.append(literal)
    return sql % tuple(literals)
