"""Queue configuration: the options of the original library under snake_case names, validated once."""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

TABLE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,39}$")
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
#: Programming errors: a job that raises one of these fails for good instead of retrying for ever.
DEFAULT_PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    TypeError,
    AttributeError,
    NameError,
    ArithmeticError,
    ImportError,
)

#: The largest encoded parameters (JSON, or pickle) publish accepts: 1 MiB, far below MariaDB's
#: default max_allowed_packet (16 MiB), so one job's INSERT never reaches the server's limit.
DEFAULT_MAX_PARAMETERS_BYTES = 1024 * 1024


@dataclass(frozen=True)
class CallbackSpec:
    """One configured callback: the function, its sub-queue and its default priority."""

    name: str
    func: Callable[..., Any]
    queue: str | None = None
    priority: int | None = None


@dataclass(frozen=True)
class Config:
    """The validated configuration of a Queue (see Queue's docstring for every option)."""

    callbacks: Mapping[str, CallbackSpec]
    database_url: str | None = None
    queue: str = "default"
    table_name: str = "background_job"
    priorities: tuple[int, ...] = (1,)
    bulk_size: int = 1
    waiting_job_expiration: int = 1000
    notify_on_number_of_attempts: int | None = None
    on_before_process: Callable[..., Any] | None = None
    on_after_process: Callable[..., Any] | None = None
    on_error: Callable[..., Any] | None = None
    on_processing_get_metadata: Callable[..., Any] | None = None
    stalled_job_timeout: int = 3600
    stalled_job_backoff: int | None = None
    heartbeat_interval: int = 60
    lost_message_timeout: int = 3600
    lock_timeout: int = 5
    producer: Any = None
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("bgq"))
    allow_pickle: bool = False
    permanent_errors: tuple[type[BaseException], ...] = DEFAULT_PERMANENT_ERRORS
    data_dir: str | None = None
    max_parameters_bytes: int = DEFAULT_MAX_PARAMETERS_BYTES
    clock: Callable[[], dt.datetime] | None = None
    worker_heartbeat_interval: int = 5
    worker_dead_after: int = 30
    log_format: str = "text"
    pooled: bool = False
    listen_url: str | None = None

    def served_queue(self, sub_queue: str | None) -> str:
        """queue_name() for a worker (`bgq work`, `bgq consume`): also ConfigError for a sub-queue
        no configured callback is in, whose jobs this process could only fail as unknown."""
        name = self.queue_name(sub_queue)
        if sub_queue is not None and all(spec.queue != sub_queue for spec in self.callbacks.values()):
            subs = sorted({spec.queue for spec in self.callbacks.values() if spec.queue is not None})
            raise ConfigError(
                f"No callback of this queue is in the sub-queue {sub_queue!r} "
                f"(its sub-queues: {', '.join(subs) or 'none'})."
            )
        return name

    def queue_name(self, sub_queue: str | None) -> str:
        """The job's queue: the base queue, or '<queue>_<sub_queue>' (ConfigError for a sub-queue
        a callback could not be declared with: other characters, or digits only)."""
        if sub_queue is None:
            return self.queue
        if not QUEUE_NAME_RE.fullmatch(sub_queue) or sub_queue.isdigit():
            raise ConfigError(
                f"Invalid sub-queue {sub_queue!r}: letters, digits, _ . - (not digits only, which "
                "would collide with the per-priority queue names)."
            )
        return f"{self.queue}_{sub_queue}"


def read_clock(clock: Callable[[], dt.datetime]) -> dt.datetime:
    """The configured clock's time in UTC (pymysql sends a datetime's wall time, dropping its zone);
    ConfigError when the clock does not return an aware datetime."""
    now = clock()
    if not isinstance(now, dt.datetime) or now.utcoffset() is None:
        raise ConfigError(f'Option "clock" must return an aware datetime, got {now!r}.')
    return now.astimezone(dt.UTC)


def _non_negative_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f'Option "{name}" must be a non-negative integer, got {value!r}.')
    return value


def _hook(name: str, value: Any) -> Callable[..., Any] | None:
    if value is not None and not callable(value):
        raise ConfigError(f'Option "{name}" must be callable or None, got {value!r}.')
    hook: Callable[..., Any] | None = value
    return hook


def encodable(text: str) -> bool:
    """True when the text is valid Unicode (no lone surrogate), so it can be sent as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def validate_priorities(priorities: Any) -> tuple[int, ...]:
    if isinstance(priorities, str | bytes) or not isinstance(priorities, Sequence) or not priorities:
        raise ConfigError('Option "priorities" must be a non-empty list of integers.')
    items = list(priorities)
    listing = ",".join(str(p) for p in items)
    if any(isinstance(p, bool) or not isinstance(p, int) for p in items):
        raise ConfigError(f"There are non-integer values in priorities list: {listing}")
    if len(set(items)) != len(items):
        raise ConfigError(f"There are duplicates priority in priorities list: {listing}")
    if any(p < 0 or p > 999 for p in items):
        raise ConfigError(f"There are value out of range 0-999 in priorities list: {listing}")
    return tuple(items)


def _callbacks(raw: Any, priorities: tuple[int, ...]) -> dict[str, CallbackSpec]:
    if not isinstance(raw, Mapping):
        raise ConfigError('Option "callbacks" must be a mapping of name -> callable.')
    specs: dict[str, CallbackSpec] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not name or len(name) > 255:
            raise ConfigError(f"Callback name {name!r} must be a non-empty string of at most 255 characters.")
        if "\x00" in name or not encodable(name):
            raise ConfigError(f"Callback name {name!r} must not contain NUL or lone surrogate characters.")
        if callable(value):
            specs[name] = CallbackSpec(name, value)
            continue
        if not isinstance(value, Mapping) or not callable(value.get("callback")):
            raise ConfigError(
                f'Callback "{name}" must be a callable or a mapping with a callable "callback" '
                '(and optional "queue" and "priority").'
            )
        unknown = set(value) - {"callback", "queue", "priority"}
        if unknown:
            raise ConfigError(f'Callback "{name}" has unknown keys: {", ".join(sorted(unknown))}.')
        sub = value.get("queue")
        if sub is not None and (not isinstance(sub, str) or not QUEUE_NAME_RE.fullmatch(sub)):
            raise ConfigError(f'Callback "{name}" has an invalid queue {sub!r} (letters, digits, _ . -).')
        if sub is not None and sub.isdigit():
            raise ConfigError(
                f'Callback "{name}" has the numeric queue {sub!r}, which would collide with the '
                "per-priority queue names."
            )
        prio = value.get("priority")
        if prio is not None and (isinstance(prio, bool) or prio not in priorities):
            raise ConfigError(
                f'Callback "{name}" has priority {prio!r}, which is not in priorities '
                f"{','.join(map(str, priorities))}."
            )
        specs[name] = CallbackSpec(name, value["callback"], sub, prio)
    return specs


def register_callback(
    config: Config, name: str, func: Callable[..., Any], queue: str | None, priority: int | None
) -> CallbackSpec:
    """Add a callback to a configuration's registry (`@queue.task`), validated like `callbacks`.

    The registry is one dict shared by every part of the queue (and by a configuration the CLI
    rebuilds from it), so a task registered before or after the queue connects is seen by all."""
    if name in config.callbacks:
        raise ConfigError(f'Callback "{name}" is already registered.')
    options: dict[str, Any] = {"callback": func}
    if queue is not None:
        options["queue"] = queue
    if priority is not None:
        options["priority"] = priority
    spec = _callbacks({name: options}, config.priorities)[name]
    registry = config.callbacks
    if not isinstance(registry, MutableMapping):
        raise ConfigError("This configuration's callbacks are read-only; pass them as a dict.")
    registry[name] = spec
    return spec


#: The log formats of option `log_format` and `bgq --log-format` (bgq/logfmt.py).
LOG_FORMATS = ("text", "json")


def _workers_options(opts: dict[str, Any]) -> None:
    """worker_heartbeat_interval (s, at least 1), worker_dead_after (s, 0 = off, else more than
    twice the interval, so one late heartbeat never reaps a live worker's job) and log_format."""
    interval = opts.get("worker_heartbeat_interval", 5)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ConfigError(f'Option "worker_heartbeat_interval" must be a positive integer, got {interval!r}.')
    dead = _non_negative_int("worker_dead_after", opts.get("worker_dead_after", 30))
    if dead and dead <= 2 * interval:
        raise ConfigError(
            f'Option "worker_dead_after" ({dead}) must be 0 (off) or more than twice '
            f"worker_heartbeat_interval ({interval})."
        )
    fmt = opts.get("log_format", "text")
    if fmt not in LOG_FORMATS:
        raise ConfigError(f'Option "log_format" must be one of {", ".join(LOG_FORMATS)}, got {fmt!r}.')


#: The values of BGQ_POOLED that mean yes / no (as `bgq --pooled` reads it).
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def env_flag(name: str) -> bool | None:
    """An environment variable read as a yes/no flag; None when it is not set."""
    raw = os.environ.get(name)
    if raw is None:
        return None
    if raw.strip().lower() in _TRUE:
        return True
    if raw.strip().lower() in _FALSE:
        return False
    raise ConfigError(f"{name} must be 1/true/yes/on or 0/false/no/off, got {raw!r}.")


def _pooler_options(opts: dict[str, Any]) -> None:
    """pooled (default $BGQ_POOLED, else False) and listen_url (default $BGQ_LISTEN_URL)."""
    if opts.get("pooled") is None:
        opts["pooled"] = bool(env_flag("BGQ_POOLED"))
    if not isinstance(opts["pooled"], bool):
        raise ConfigError(f'Option "pooled" must be True or False, got {opts["pooled"]!r}.')
    if opts.get("listen_url") is None:
        opts["listen_url"] = os.environ.get("BGQ_LISTEN_URL") or None
    listen = opts["listen_url"]
    if listen is not None and not isinstance(listen, str):
        raise ConfigError(f'Option "listen_url" must be a database URL, got {listen!r}.')


def build_config(**options: Any) -> Config:
    """Validate the keyword options of Queue(...) and return the Config."""
    fields = set(Config.__dataclass_fields__)
    unknown = set(options) - fields
    if unknown:
        raise ConfigError(f"Unknown option(s): {', '.join(sorted(unknown))}.")
    opts = dict(options)
    opts.setdefault("callbacks", {})  # optional: `@queue.task` registers callbacks too (bgq/tasks.py)
    opts["priorities"] = validate_priorities(opts.get("priorities", (1,)))
    opts["callbacks"] = _callbacks(opts["callbacks"], opts["priorities"])
    if opts.get("producer") is not None and 0 in opts["priorities"]:
        raise ConfigError(
            "Priority 0 cannot be used with a producer: <queue>_0 is the broker's control queue "
            "(die messages). Use priorities 1 to 999."
        )
    if opts.get("database_url") is None:
        opts["database_url"] = os.environ.get("BGQ_DATABASE_URL") or None
    _pooler_options(opts)
    table = opts.get("table_name", "background_job")
    if not isinstance(table, str) or not TABLE_NAME_RE.fullmatch(table):
        raise ConfigError(
            f"Invalid table name {table!r}: a letter or _, then letters, digits or _ (at most 40)."
        )
    queue = opts.get("queue", "default")
    if not isinstance(queue, str) or not QUEUE_NAME_RE.fullmatch(queue):
        raise ConfigError(f"Invalid queue name {queue!r}: letters, digits, _ . -, at most 200 characters.")
    bulk = opts.get("bulk_size", 1)
    if isinstance(bulk, bool) or not isinstance(bulk, int) or bulk < 1:
        raise ConfigError(f'Option "bulk_size" must be a positive integer, got {bulk!r}.')
    limit = opts.get("max_parameters_bytes", DEFAULT_MAX_PARAMETERS_BYTES)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f'Option "max_parameters_bytes" must be a positive integer, got {limit!r}.')
    for name in (
        "waiting_job_expiration",
        "stalled_job_timeout",
        "heartbeat_interval",
        "lost_message_timeout",
        "lock_timeout",
    ):
        if name in opts:
            opts[name] = _non_negative_int(name, opts[name])
    if opts.get("stalled_job_backoff") is not None:
        opts["stalled_job_backoff"] = _non_negative_int("stalled_job_backoff", opts["stalled_job_backoff"])
    _workers_options(opts)
    if not opts.get("waiting_job_expiration"):
        opts["waiting_job_expiration"] = 1000  # as in the original: 0 means the default
    notify = opts.get("notify_on_number_of_attempts")
    if notify is not None and notify is not False:
        opts["notify_on_number_of_attempts"] = (
            _non_negative_int("notify_on_number_of_attempts", notify) or None
        )
    else:
        opts["notify_on_number_of_attempts"] = None
    for name in ("on_before_process", "on_after_process", "on_error", "on_processing_get_metadata", "clock"):
        opts[name] = _hook(name, opts.get(name))
    logger = opts.get("logger")
    if logger is None:
        opts.pop("logger", None)
    elif not isinstance(logger, logging.Logger | logging.LoggerAdapter):
        raise ConfigError('Option "logger" must be a logging.Logger.')
    errors = opts.get("permanent_errors", DEFAULT_PERMANENT_ERRORS)
    if not isinstance(errors, tuple) or not all(
        isinstance(e, type) and issubclass(e, BaseException) for e in errors
    ):
        raise ConfigError('Option "permanent_errors" must be a tuple of exception classes.')
    return Config(**opts)
