"""bgq's one retry policy: a transaction that failed with a retryable DatabaseError runs again."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import tenacity
from sqlalchemy.engine import Connection

from .errors import DatabaseError, NodeNotReadyError

if TYPE_CHECKING:
    from .db import Database

T = TypeVar("T")
#: Attempts in all, waiting 0.1 s, 0.2 s, ... between them (about 1 s over five attempts).
TRIES = 5
PAUSE_S = 0.1

_log = logging.getLogger("bgq")


def retryable(exc: BaseException) -> bool:
    """True for an error that running the whole transaction again may cure: a lock timeout, a
    deadlock (on Galera also a failed certification at COMMIT), a serialisation failure, a lost
    connection, a Galera node not ready (each class says so in `retryable`)."""
    return isinstance(exc, DatabaseError) and exc.retryable


def _before_sleep(state: tenacity.RetryCallState) -> None:
    """One line per retry: DEBUG for the everyday conflicts (a deadlock or certification failure
    is cured by the next try), WARNING for a Galera node that is not ready (a node fault)."""
    exc = state.outcome.exception() if state.outcome else None
    message = f"bgq: retrying the transaction (try {state.attempt_number + 1}) after {exc!r}"
    if isinstance(exc, NodeNotReadyError):
        _log.warning(message)
    else:
        _log.debug(message)


def policy(tries: int = TRIES) -> tenacity.Retrying:
    """The retry policy as a tenacity.Retrying: retryable errors only, `tries` attempts in all,
    linearly longer pauses; the last error is re-raised as is."""
    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(tries),
        wait=tenacity.wait_incrementing(start=PAUSE_S, increment=PAUSE_S),
        retry=tenacity.retry_if_exception(retryable),
        before_sleep=_before_sleep,
        sleep=lambda seconds: time.sleep(seconds),  # looked up per call, so tests can stub it
        reraise=True,
    )


def in_transaction(db: Database, call: Callable[[Connection], T], *, tries: int = TRIES) -> T:
    """Run `call(conn)` in a transaction of `db`; on a retryable error roll back and run it
    again in a new transaction, up to `tries` attempts in all."""
    for attempt in policy(tries):
        with attempt, db.transaction() as conn:
            return call(conn)
    raise AssertionError("unreachable: the policy re-raises the last error")
