"""Every exception bgq raises, and the ones a callback raises to steer its job's outcome."""

from __future__ import annotations


class BgqError(Exception):
    """bgq failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


# --- configuration and publish-time validation (nothing is written when these are raised) ---


class ConfigError(BgqError, ValueError):
    """The queue configuration is invalid."""


class PublishError(BgqError, ValueError):
    """The job cannot be published as asked."""


class UnknownCallbackError(PublishError):
    """The callback name is not in the `callbacks` config."""


class SerializationError(PublishError, TypeError):
    """The parameters cannot be stored as JSON (pass allow_pickle=True to store them pickled)."""


class PriorityError(PublishError):
    """The priority is not one of the configured priorities."""


# --- database ---


class DatabaseError(BgqError):
    """The database refused or failed a bgq call."""

    #: Whether running the whole transaction again may succeed (bgq.sql.retry reads it).
    retryable: bool = False


class DatabaseUnavailableError(DatabaseError):
    """The database cannot be reached."""


class ConnectionLostError(DatabaseUnavailableError):
    """The database connection was lost or cut by the server (killed, idle timeout, restart)."""

    retryable = True  # the pool hands out a fresh connection; an unfinished transaction was rolled back


class ReadOnlyError(DatabaseUnavailableError):
    """The database server refuses writes (a standby, or a read-only session); bgq connects again."""

    # PostgreSQL SQLSTATE 25006 read_only_sql_transaction, MySQL/MariaDB 1290 (--read-only) and
    # 1792 (a READ ONLY transaction): e.g. the old primary's address after a failover, or a URL
    # to a standby without target_session_attrs=read-write.
    # Nothing was written. bgq drops every pooled connection (they reach the same read-only
    # server) and the next attempt connects again: a multi-host URL with
    # target_session_attrs=read-write then finds the primary that took over.
    retryable = True


class OutcomeUnknownError(ConnectionLostError):
    """The connection was lost after a statement went out in a transaction of its own (a publish):
    the server may have committed it, so running it again could do it twice."""

    retryable = False


class LockTimeoutError(DatabaseError):
    """A lock wait timed out (MySQL innodb_lock_wait_timeout, PostgreSQL lock_timeout or NOWAIT)."""

    retryable = True


class DeadlockError(DatabaseError):
    """The database broke a deadlock by rolling this transaction back (on Galera also: the
    transaction lost the certification against another node's commit of the same rows)."""

    retryable = True


class NodeNotReadyError(DatabaseUnavailableError):
    """The Galera node is not ready for queries (not Synced: joining, donating or cut off from the
    cluster's primary component); nothing was done (MariaDB error 1047). The connection is
    dropped, so the next try connects again (through haproxy: to a Synced node)."""

    retryable = True


class SerializationFailureError(DatabaseError):
    """The transaction conflicted with a concurrent one and was rolled back."""

    retryable = True


class StatementCanceledError(DatabaseError):
    """The server cancelled a statement (a statement timeout, or a cancel or KILL QUERY)."""


class PacketTooLargeError(DatabaseError):
    """A statement or value is larger than the server accepts (MySQL max_allowed_packet)."""


class SchemaVersionError(DatabaseError):
    """The installed bgq procedures are missing or of another version: run `bgq install-procs`."""


class JobNotFoundError(DatabaseError):
    """No such job."""


class JobStateError(DatabaseError):
    """The job is not in a state that allows this."""


# --- raised inside a running callback by bgq ---


class JobAborted(BgqError):
    """The running job must stop: it was cancelled (`queue.cancel`, `bgq cancel`), or its claim
    was lost (reaped and taken over by another worker). Raised by `queue.heartbeat()` and by the
    automatic SQLAlchemy heartbeat hook in the thread that runs the callback; a cancelled job is
    recorded REDUNDANT with the reason even if the callback swallows this exception."""


# --- raised by callbacks to choose their job's outcome (names as in the original library) ---


class BackgroundQueueException(Exception):
    """Base of the exceptions a callback raises to choose its job's outcome."""


class PermanentErrorException(BackgroundQueueException):
    """The job failed for good: PERMANENTLY_FAILED, no retry, logged critical."""


class TemporaryErrorException(BackgroundQueueException):
    """The job failed for now: TEMPORARILY_FAILED, retried after its backoff."""


class SkipException(BackgroundQueueException):
    """Nothing to do: FINISHED with this message, no retry."""


class WaitingException(BackgroundQueueException):
    """Not yet: FINISHED, and a fresh copy of the job runs after waiting_job_expiration."""


class DieException(BackgroundQueueException):
    """Stop the worker after this job. Without a cause the job is PERMANENTLY_FAILED; with a
    cause (`raise DieException() from err`) the job is classified by the cause."""
