"""PostgreSQL (psycopg 3): SELECT-from-function syntax with typed parameters, and SQLSTATEs."""

from __future__ import annotations

from typing import Any

from ..errors import (
    BgqError,
    DatabaseError,
    DatabaseUnavailableError,
    JobNotFoundError,
    JobStateError,
    SchemaVersionError,
)
from . import Proc

# SQLSTATEs the functions RAISE (db/postgres/*.sql headers).
_BGQ_ERRORS: dict[str, type[BgqError]] = {
    "BQ001": JobNotFoundError,
    "BQ002": DatabaseError,
    "BQ003": JobStateError,
}
_RETRYABLE = {"40P01", "40001", "55P03"}  # deadlock, serialization failure, lock not available
_UNREACHABLE_CLASS = "08"
_NOT_INSTALLED = {"42P01", "42883"}  # undefined table; undefined function


class PostgresDialect:
    name = "postgres"

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
        if state and state.startswith(_UNREACHABLE_CLASS):
            return DatabaseUnavailableError(f"Cannot reach the database: {exc}")
        return None

    def session_sql(self, dbapi_connection: Any, seconds: int) -> list[str]:
        ms = int(seconds) * 1000
        return [f"SET lock_timeout = {ms}", f"SET idle_in_transaction_session_timeout = {ms}"]

    def is_deadlock(self, exc: BaseException) -> bool:
        return getattr(exc, "sqlstate", None) in _RETRYABLE
