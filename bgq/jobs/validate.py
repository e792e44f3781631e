"""Publish-time checks: every argument of Queue.publish is validated before anything is written."""

from __future__ import annotations

import datetime as dt
from typing import Any

from ..config import Config, encodable
from ..errors import PriorityError, PublishError, UnknownCallbackError
from ..model import Mode, NewJob
from . import params as params_codec

MAX_TEXT = 255  # VARCHAR(255): serial_group, identifier
_MAX_INT32 = 2**31 - 1
MAX_BIGINT = 2**63 - 1  # BIGINT columns: ids, coalesce_threshold


def new_job(
    cfg: Config,
    callback_name: Any,
    parameters: Any,
    serial_group: Any,
    identifier: Any,
    mode: Any,
    postpone_by: Any,
    priority: Any,
    coalesce_threshold: Any,
) -> NewJob:
    """The job to insert, or the first PublishError its arguments earn (checked in a fixed order).

    On the hot path of every publish: the common cases (mode normal, an int priority from the
    list, no group or identifier) pass on one comparison each; the full checks and their
    messages run for the rest."""
    if not callback_name:
        raise PublishError('The job does not have the required parameter "callback_name" set.')
    spec = cfg.callbacks.get(callback_name) if isinstance(callback_name, str) else None
    if spec is None:
        raise UnknownCallbackError(f'Callback "{callback_name}" does not exist.')
    if mode is Mode.NORMAL or (type(mode) is str and mode == "normal"):
        mode_value = "normal"
    else:
        try:
            mode_value = Mode(mode).value
        except ValueError:
            raise PublishError(f"Unknown mode {mode!r}: use normal, unique or recurring.") from None
        if mode_value != "normal" and not identifier:
            raise PublishError(f'Parameter "identifier" has to be set if "mode" is {mode_value}.')
    if coalesce_threshold is not None and not serial_group:
        raise PublishError('Parameter "serial_group" has to be set if "coalesce_threshold" is used.')
    if priority is None:
        priority = spec.priority if spec.priority is not None else cfg.priorities[0]
    if type(priority) is not int or priority not in cfg.priorities:
        _check_priority(cfg, callback_name, priority)
    if serial_group is not None:
        check_text("serial_group", serial_group)
    if identifier is not None:
        check_text("identifier", identifier)
    if coalesce_threshold is not None and (
        isinstance(coalesce_threshold, bool)
        or not isinstance(coalesce_threshold, int)
        or not -MAX_BIGINT - 1 <= coalesce_threshold <= MAX_BIGINT
    ):
        raise PublishError('Parameter "coalesce_threshold" must be a 64-bit integer.')
    postponed_by = None if postpone_by is None else _milliseconds(postpone_by)
    parameters_json, pickled = params_codec.encode(parameters, allow_pickle=cfg.allow_pickle)
    size = params_codec.encoded_size(parameters_json, pickled)
    if size > cfg.max_parameters_bytes:
        raise PublishError(
            f"The parameters take {size} bytes encoded, more than max_parameters_bytes "
            f"({cfg.max_parameters_bytes}): store large data elsewhere and pass a reference."
        )
    return NewJob(
        queue=cfg.queue_name(spec.queue),
        priority=priority,
        callback_name=callback_name,
        parameters_json=parameters_json,
        parameters=pickled,
        serial_group=serial_group,
        coalesce_threshold=coalesce_threshold,
        identifier=identifier,
        mode=mode_value,
        postponed_by=postponed_by,
        processed_by_broker=cfg.producer is not None,
    )


def _check_priority(cfg: Config, callback_name: str, priority: Any) -> None:
    """Raise PriorityError unless `priority` is an integer of the configured list."""
    if isinstance(priority, str):
        raise PriorityError(
            f"Priority {priority!r} for callback {callback_name} is a string: priorities are integers "
            f"({','.join(map(str, cfg.priorities))})."
        )
    if not isinstance(priority, int) and priority in cfg.priorities:  # 1.0, Decimal(1): not an int
        raise PriorityError(
            f"Priority {priority!r} for callback {callback_name} is a {type(priority).__name__}: "
            f"priorities are integers ({','.join(map(str, cfg.priorities))})."
        )
    if isinstance(priority, bool):
        raise PriorityError(
            f"Priority {priority!r} for callback {callback_name} is a bool: priorities are integers "
            f"({','.join(map(str, cfg.priorities))})."
        )
    if priority not in cfg.priorities:
        raise PriorityError(
            f"Priority {priority} for callback {callback_name} is not in available priorities: "
            f"{','.join(map(str, cfg.priorities))}"
        )


def check_text(name: str, value: Any) -> None:
    """Raise PublishError unless `value` is a group name or identifier both dialects store alike."""
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise PublishError(f'Parameter "{name}" must be a non-empty string of at most {MAX_TEXT} characters.')
    if "\x00" in value or not encodable(value):
        # PostgreSQL text cannot hold NUL (MariaDB would store it): refuse it on both.
        raise PublishError(
            f'Parameter "{name}" must not contain NUL or lone surrogate characters: {value!r}.'
        )
    if value != value.rstrip():
        # MySQL compares these PAD SPACE ('a ' = 'a'), PostgreSQL does not: refuse the ambiguity.
        raise PublishError(f'Parameter "{name}" must not end with whitespace: {value!r}.')


def _milliseconds(value: int | dt.timedelta | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, dt.timedelta):
        value = value // dt.timedelta(milliseconds=1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > _MAX_INT32:
        raise PublishError(
            f'Parameter "postpone_by" must be 0..{_MAX_INT32} ms or a timedelta, got {value!r}.'
        )
    return value
