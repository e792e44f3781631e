"""Encoding of job parameters: JSON with dates, times and Decimals; pickle only when allowed."""

from __future__ import annotations

import datetime as dt
import json
import pickle
from decimal import Decimal
from typing import Any

from .errors import SerializationError

# A tagged object stands for a value JSON has no type for; a plain dict never has this key.
_TAG = "__bgq__"


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise SerializationError(f"Parameter value {value!r} cannot be stored as JSON.")
        return value
    if isinstance(value, dt.datetime):
        return {_TAG: "datetime", "v": value.isoformat()}
    if isinstance(value, dt.date):
        return {_TAG: "date", "v": value.isoformat()}
    if isinstance(value, dt.time):
        return {_TAG: "time", "v": value.isoformat()}
    if isinstance(value, Decimal):
        return {_TAG: "decimal", "v": str(value)}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        out = {}
        for key, v in value.items():
            if not isinstance(key, str):
                raise SerializationError(f"Parameter key {key!r} is not a string; JSON needs string keys.")
            if key == _TAG:
                raise SerializationError(f"Parameter key {_TAG!r} is reserved by bgq.")
            out[key] = _encode(v)
        return out
    raise SerializationError(
        f"Parameter value of type {type(value).__name__} cannot be stored as JSON "
        "(use scalars, lists, dicts, None, dates, times, datetimes or Decimals, "
        "or configure the queue with allow_pickle=True)."
    )


def _decode_hook(obj: dict[str, Any]) -> Any:
    kind = obj.get(_TAG)
    if kind is None:
        return obj
    raw = obj["v"]
    if kind == "datetime":
        return dt.datetime.fromisoformat(raw)
    if kind == "date":
        return dt.date.fromisoformat(raw)
    if kind == "time":
        return dt.time.fromisoformat(raw)
    if kind == "decimal":
        return Decimal(raw)
    raise ValueError(f"Unknown bgq parameter tag {kind!r}")


def encode(parameters: Any, *, allow_pickle: bool) -> tuple[str | None, bytes | None]:
    """Return (parameters_json, parameters_pickle); at most one is set, both None for no arguments."""
    if parameters is None or (isinstance(parameters, list | tuple | dict) and len(parameters) == 0):
        return None, None
    if not isinstance(parameters, list | tuple | dict):
        raise SerializationError(
            "Parameters must be a list or tuple (positional arguments) or a dict (keyword arguments), "
            f"not {type(parameters).__name__}."
        )
    try:
        return json.dumps(_encode(parameters), separators=(",", ":"), ensure_ascii=False), None
    except SerializationError:
        if not allow_pickle:
            raise
    try:
        return None, pickle.dumps(parameters, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # TypeError, PicklingError, AttributeError (lambdas, locks, generators)
        raise SerializationError(f"Parameters cannot be pickled either: {type(exc).__name__}: {exc}") from exc


def decode(parameters_json: str | None, parameters_pickle: bytes | None, *, allow_pickle: bool) -> Any:
    """Return the stored parameters: a list, a dict, or [] for none."""
    if parameters_json not in (None, ""):
        if not isinstance(parameters_json, str):  # some drivers hand JSON back already parsed
            parameters_json = json.dumps(parameters_json)
        return json.loads(parameters_json, object_hook=_decode_hook)
    if parameters_pickle:
        if not allow_pickle:
            raise SerializationError(
                "This job's parameters are pickled, and the queue does not allow pickle "
                "(unpickling rows from a shared table runs code): set allow_pickle=True."
            )
        return pickle.loads(bytes(parameters_pickle))
    return []
