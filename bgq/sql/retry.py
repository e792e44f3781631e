"""bgq's one retry policy: a transaction that failed with a retryable DatabaseError runs again.

Two schedules of it: `policy` for an ordinary transaction (retryable errors only, about a
second in all), `persist_policy` for a job's result once its callback has run (every bgq error,
about 15 s in all, never more than a second apart, so that a failover does not lose the result)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import tenacity
from sqlalchemy.engine import Connection

from ..errors import BgqError, DatabaseError, NodeNotReadyError

if TYPE_CHECKING:
    from ..db import Database

T = TypeVar("T")
#: Attempts in all, waiting 0.1 s, 0.2 s, ... between them (about 1 s over five attempts).
TRIES = 5
PAUSE_S = 0.1

#: Seconds before each try of a result write: fast at first (a cut session or a deadlock is cured
#: at once), then every second for about 15 s in all. Never longer than a second apart: the
#: job's group waits for this result, and a database that serves again (a failover, a cluster
#: node dropped from the view) should get it within a second, before the reaper's
#: stalled_job_timeout takes the job back and runs it a second time.
PERSIST_PAUSES = (0.0, 0.05, 0.2, 0.5) + (1.0,) * 15

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


def persist_policy(before_retry: Callable[[BgqError], None]) -> tenacity.Retrying:
    """The retry policy of a write that must not be lost (a job's result): every BgqError is
    tried again (a non-retryable one too: the callback has run, and the next try is cheap),
    len(PERSIST_PAUSES) attempts in all after the pauses of PERSIST_PAUSES; `before_retry` gets
    each error that is retried (the caller logs it); the last error is re-raised as is."""

    def wait(state: tenacity.RetryCallState) -> float:
        # The pause before try n + 1 (tenacity also asks after the last try, before it stops).
        n = state.attempt_number
        return PERSIST_PAUSES[n] if n < len(PERSIST_PAUSES) else 0.0

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, BgqError):
            before_retry(exc)

    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(len(PERSIST_PAUSES)),
        wait=wait,
        retry=tenacity.retry_if_exception_type(BgqError),
        before_sleep=before_sleep,
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
