"""Encoding of job parameters: JSON with dates, times, zones and Decimals; pickle only when allowed."""

from __future__ import annotations

import datetime as dt
import json
import pickle
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from ..errors import SerializationError

# A tagged object stands for a value JSON has no type for; a plain dict never has this key.
_TAG = "__bgq__"
# Built once: json.dumps with these options would build an encoder on every call (a third of
# a publish's validation).
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise SerializationError(f"Parameter value {value!r} cannot be stored as JSON.")
        return value
    if isinstance(value, dt.datetime):
        return {_TAG: "datetime", "v": value.isoformat(), **_zone(value)}
    if isinstance(value, dt.date):
        return {_TAG: "date", "v": value.isoformat()}
    if isinstance(value, dt.time):
        return {_TAG: "time", "v": value.isoformat(), **_zone(value)}
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


def _zone(value: dt.datetime | dt.time) -> dict[str, str]:
    """A value's time zone as stored beside its ISO text: none for a naive value or a fixed
    offset (the ISO text holds it), the key of a ZoneInfo zone (so it comes back DST-aware);
    any other tzinfo cannot be stored faithfully and is refused."""
    zone = value.tzinfo
    if zone is None or type(zone) is dt.timezone:
        return {}
    if isinstance(zone, ZoneInfo) and zone.key:
        return {"tz": zone.key}
    raise SerializationError(
        f"Parameter value {value!r} has a time zone of type {type(zone).__name__}, which bgq cannot "
        "store without changing it: use a zoneinfo.ZoneInfo zone (kept by name) or a "
        "datetime.timezone offset (or configure the queue with allow_pickle=True)."
    )


def _decode_hook(obj: dict[str, Any]) -> Any:
    kind = obj.get(_TAG)
    if kind is None:
        return obj
    raw = obj["v"]
    zone = ZoneInfo(obj["tz"]) if "tz" in obj else None
    if kind == "datetime":
        value = dt.datetime.fromisoformat(raw)
        # The ISO text holds the offset: the same instant, shown in its zone (fold included).
        return value.astimezone(zone) if zone is not None else value
    if kind == "date":
        return dt.date.fromisoformat(raw)
    if kind == "time":
        clock = dt.time.fromisoformat(raw)
        return clock.replace(tzinfo=zone) if zone is not None else clock
    if kind == "decimal":
        return Decimal(raw)
    raise ValueError(f"Unknown bgq parameter tag {kind!r}")


def encode(parameters: Any, *, allow_pickle: bool) -> tuple[str | None, bytes | None]:
    """Return (parameters_json, parameters_pickle); at most one is set, both None for no arguments."""
    if _flat(parameters):  # on every publish: the common case goes to JSON as it is
        if not parameters:
            return None, None
        text = _JSON.encode(parameters)
        if text.isascii() or _valid_unicode(text):
            return text, None
    if parameters is None or (isinstance(parameters, list | tuple | dict) and len(parameters) == 0):
        return None, None
    if not isinstance(parameters, list | tuple | dict):
        raise SerializationError(
            "Parameters must be a list or tuple (positional arguments) or a dict (keyword arguments), "
            f"not {type(parameters).__name__}."
        )
    try:
        try:
            text = _JSON.encode(_encode(parameters))
        except RecursionError:
            raise SerializationError("Parameters are nested too deeply to be stored as JSON.") from None
        _check_unicode(text)
        return text, None
    except SerializationError:
        if not allow_pickle:
            raise
    try:
        return None, pickle.dumps(parameters, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # TypeError, PicklingError, AttributeError (lambdas, locks, generators)
        raise SerializationError(f"Parameters cannot be pickled either: {type(exc).__name__}: {exc}") from exc


#: What a flat list, tuple or dict of parameters may hold to go to JSON without _encode's walk:
#: JSON writes these as they are (a float may be NaN or infinite: it takes the walk).
_PLAIN = frozenset({str, int, bool, type(None)})


def _flat(parameters: Any) -> bool:
    """Whether `parameters` is a list, tuple or dict (exactly) of _PLAIN values, keyed by
    strings other than _TAG: what _encode would hand to JSON unchanged."""
    kind = type(parameters)
    if kind is list or kind is tuple:
        for value in parameters:  # noqa: SIM110 (a loop: half the time of all() over a generator)
            if type(value) not in _PLAIN:
                return False
        return True
    if kind is dict and _TAG not in parameters:
        for key, value in parameters.items():
            if type(key) is not str or type(value) not in _PLAIN:
                return False
        return True
    return False


def _valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_unicode(text: str) -> None:
    """Refuse text that is not valid Unicode (a lone surrogate such as "\\ud800"): no database
    can store it as UTF-8 text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SerializationError(
            f"Parameters contain a string that is not valid Unicode ({exc.object[exc.start : exc.end]!r}, "
            "a lone surrogate), which cannot be stored as JSON text."
        ) from None


def encoded_size(parameters_json: str | None, parameters_pickle: bytes | None) -> int:
    """The bytes the encoded parameters take in the INSERT (UTF-8 JSON, or the pickle)."""
    if parameters_json is not None:
        return len(parameters_json) if parameters_json.isascii() else len(parameters_json.encode("utf-8"))
    return len(parameters_pickle or b"")


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
