"""JSON log lines (`bgq --log-format json`, option log_format): one JSON object per record.

Every record becomes {"ts", "level", "logger", "message"} plus, on the job-outcome lines the
Executor writes after each run (INFO, "bgq: Job ran: <outcome>. (ID: n)"; WARNING for a temporary
failure, with "error"), the fields job_id, callback, queue, group, attempt, outcome and duration_ms,
then error; a record with an exception adds
"exception" (its traceback as text). Any other `extra` field a record carries that JSON can hold
is kept too.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

#: The attributes every LogRecord has: not copied into the JSON object as fields.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}
#: The fields of a job-outcome line, in this order.
JOB_FIELDS = ("job_id", "callback", "queue", "group", "attempt", "outcome", "duration_ms", "error")


class JsonFormatter(logging.Formatter):
    """A logging.Formatter that writes one JSON object per record (one line)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in JOB_FIELDS:
            if key in record.__dict__:
                out[key] = record.__dict__[key]
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in out and not key.startswith("_"):
                out[key] = value if isinstance(value, str | int | float | bool | None) else str(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


_handler: logging.Handler | None = None  # the stderr handler use() added to the root logger


def use(fmt: str, level: int) -> None:
    """Log on stderr in `fmt` ("text": "LEVEL message"; "json": JsonFormatter), as
    logging.basicConfig(level=level) would: a root logger with handlers of its own (configured by
    the application, or a test's capture) is left alone. The CLI calls it; a later call only
    changes the format of the handler an earlier one added."""
    global _handler
    root = logging.getLogger()
    if _handler is None and not root.handlers:
        _handler = logging.StreamHandler()
        root.addHandler(_handler)
        root.setLevel(level)
    if _handler is not None:
        _handler.setFormatter(
            JsonFormatter() if fmt == "json" else logging.Formatter("%(levelname)s %(message)s")
        )
