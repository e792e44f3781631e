"""MySQL 8 / MariaDB 10.11 (pymysql): CALL syntax, schema splitting and error codes."""

from __future__ import annotations

from typing import Any

from ..errors import BgqError, DatabaseError, JobNotFoundError, JobStateError, SchemaVersionError
from . import Proc

# MYSQL_ERRNO values the procedures SIGNAL (db/mysql/*.sql headers), and the server's own.
_BGQ_ERRORS: dict[int, type[BgqError]] = {31001: JobNotFoundError, 31002: DatabaseError, 31003: JobStateError}
_DEADLOCK = 1213
_LOCK_WAIT_TIMEOUT = 1205
_UNREACHABLE = {2003, 2005, 2006, 2013}
_NOT_INSTALLED = {1146, 1305}  # no such table; no such procedure or function


class MySQLDialect:
    name = "mysql"

    def call_sql(self, table: str, proc: Proc) -> str:
        marks = ", ".join(["%s"] * len(proc.params))
        verb = "SELECT" if proc.function else "CALL"
        return f"{verb} {table}_{proc.name}({marks})"

    def now_sql(self) -> str:
        return "UTC_TIMESTAMP(6)"

    def drop_sql(self, table: str, name: str, function: bool) -> str:
        return f"DROP {'FUNCTION' if function else 'PROCEDURE'} IF EXISTS {table}_{name}"

    def translate(self, exc: BaseException) -> BgqError | None:
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        if code in _BGQ_ERRORS:
            message = exc.args[1] if len(exc.args) > 1 else str(exc)
            return _BGQ_ERRORS[code](str(message))
        if code in _NOT_INSTALLED:
            return SchemaVersionError(
                f"bgq is not installed for this table ({exc.args[-1]}): run `bgq install-procs`."
            )
        if code in _UNREACHABLE:
            from ..errors import DatabaseUnavailableError

            return DatabaseUnavailableError(f"Cannot reach the database: {exc}")
        return None

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

    def is_deadlock(self, exc: BaseException) -> bool:
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        return code in (_DEADLOCK, _LOCK_WAIT_TIMEOUT)
