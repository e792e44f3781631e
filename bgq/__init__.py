"""bgq: a durable background-job queue on MySQL/MariaDB or PostgreSQL, with serial groups."""

from .errors import (
    BackgroundQueueException,
    BgqError,
    ConfigError,
    DatabaseError,
    DatabaseUnavailableError,
    DieException,
    JobNotFoundError,
    JobStateError,
    PermanentErrorException,
    PriorityError,
    PublishError,
    SchemaVersionError,
    SerializationError,
    SkipException,
    TemporaryErrorException,
    UnknownCallbackError,
    WaitingException,
)
from .processing import ProcessReport
from .queue import Queue
from .states import JobState, Mode

__all__ = [
    "BackgroundQueueException",
    "BgqError",
    "ConfigError",
    "DatabaseError",
    "DatabaseUnavailableError",
    "DieException",
    "JobNotFoundError",
    "JobState",
    "JobStateError",
    "Mode",
    "PermanentErrorException",
    "PriorityError",
    "ProcessReport",
    "PublishError",
    "Queue",
    "SchemaVersionError",
    "SerializationError",
    "SkipException",
    "TemporaryErrorException",
    "UnknownCallbackError",
    "WaitingException",
]
