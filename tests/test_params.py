"""bgq.jobs.params: the JSON encoding of job parameters (with dates and Decimals) and opt-in pickle."""

from __future__ import annotations

import datetime as dt
import json
import pickle
import threading
from decimal import Decimal

import pytest

from bgq.errors import SerializationError
from bgq.jobs.params import decode, encode


class Point:
    """A picklable object that JSON cannot store."""

    def __init__(self, x: int, y: int) -> None:
        self.x, self.y = x, y

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)


def round_trip(parameters, *, allow_pickle=False):
    stored_json, stored_pickle = encode(parameters, allow_pickle=allow_pickle)
    return decode(stored_json, stored_pickle, allow_pickle=allow_pickle)


# --- round trips ---


@pytest.mark.parametrize(
    "parameters",
    [
        [1, "two", 3.5, True, False, None],
        {"to": "a@example.com", "subject": "Hi", "count": 3},
        [[1, [2, [3]]], {"nested": {"deeper": [None, {"x": 1}]}}],
        ["žluťoučký kůň", "emoji 🎉", 'quote " and \\ backslash'],
        [2**62, -(2**62), 0, -0.5, 1e300],
        {"": "empty key", "with space": 1},
    ],
)
def test_json_round_trip(parameters):
    stored_json, stored_pickle = encode(parameters, allow_pickle=False)
    assert stored_pickle is None
    assert isinstance(stored_json, str)
    result = decode(stored_json, None, allow_pickle=False)
    assert result == parameters
    assert type(result) is type(parameters)


def test_bools_stay_bools_and_ints_stay_ints():
    result = round_trip([True, 1, False, 0, 1.0])
    assert [type(v) for v in result] == [bool, int, bool, int, float]


def test_tuple_comes_back_as_list():
    assert round_trip((1, (2, 3))) == [1, [2, 3]]


def test_non_ascii_is_stored_unescaped():
    stored_json, _ = encode(["kůň"], allow_pickle=False)
    assert "kůň" in stored_json


@pytest.mark.parametrize(
    "value",
    [
        dt.datetime(2024, 2, 29, 23, 59, 58, 123456),
        dt.datetime(2024, 2, 29, 23, 59, 58, 123456, tzinfo=dt.UTC),
        dt.datetime(2024, 1, 1, 8, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5, minutes=-30))),
        dt.date(1999, 12, 31),
        dt.time(13, 14, 15, 16),
        dt.time(13, 14, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        Decimal("1.10"),
        Decimal("-123456789012345678901234567890.000000001"),
        Decimal("0E-10"),
    ],
)
def test_rich_values_round_trip_with_type_and_precision(value):
    """Checklist 20: dates, datetimes, times and Decimals come back as themselves, top-level and nested."""
    result = round_trip([value, [value], {"k": {"deep": value}}])
    for got in (result[0], result[1][0], result[2]["k"]["deep"]):
        assert got == value
        assert type(got) is type(value)
        if isinstance(value, dt.datetime | dt.time):
            assert got.tzinfo == value.tzinfo or got.utcoffset() == value.utcoffset()
            assert (got.tzinfo is None) == (value.tzinfo is None)
        if isinstance(value, Decimal):
            assert str(got) == str(value)  # '1.10' stays '1.10', not 1.1


def test_datetime_is_not_confused_with_date():
    result = round_trip([dt.date(2024, 1, 2), dt.datetime(2024, 1, 2)])
    assert type(result[0]) is dt.date
    assert type(result[1]) is dt.datetime


def test_dict_key_order_kept():
    result = round_trip({"b": 1, "a": 2, "c": 3})
    assert list(result) == ["b", "a", "c"]


# --- empty ---


@pytest.mark.parametrize("parameters", [None, [], (), {}])
def test_checklist_19_empty_parameters_store_nothing(parameters):
    assert encode(parameters, allow_pickle=False) == (None, None)
    assert encode(parameters, allow_pickle=True) == (None, None)


@pytest.mark.parametrize(("stored_json", "stored_pickle"), [(None, None), ("", None), (None, b""), ("", b"")])
def test_checklist_19_nothing_stored_decodes_to_no_arguments(stored_json, stored_pickle):
    assert decode(stored_json, stored_pickle, allow_pickle=False) == []


# --- errors ---


@pytest.mark.parametrize(
    "parameters",
    [
        [object()],
        [{1, 2}],
        [frozenset()],
        [b"bytes"],
        [bytearray(b"x")],
        [float("nan")],
        [float("inf")],
        [float("-inf")],
        [{"ok": [1, {"deep": float("nan")}]}],
        [Point(1, 2)],
        [1 + 2j],
        [dt.timedelta(seconds=1)],
        [range(3)],
    ],
    ids=lambda p: type(p[0]).__name__,
)
def test_unserialisable_values_raise(parameters):
    with pytest.raises(SerializationError):
        encode(parameters, allow_pickle=False)


@pytest.mark.parametrize("parameters", [{1: "a"}, [{None: "a"}], [{(1, 2): "a"}], {"ok": {2.5: "x"}}])
def test_non_string_dict_keys_raise(parameters):
    with pytest.raises(SerializationError, match="is not a string"):
        encode(parameters, allow_pickle=False)


@pytest.mark.parametrize("parameters", ["text", 5, 1.5, b"raw", {1, 2}, Point(1, 2)])
def test_parameters_must_be_a_list_tuple_or_dict(parameters):
    with pytest.raises(SerializationError, match="list or tuple"):
        encode(parameters, allow_pickle=False)
    with pytest.raises(SerializationError, match="list or tuple"):
        encode(parameters, allow_pickle=True)


@pytest.mark.parametrize(
    "parameters",
    [{"__bgq__": "date", "v": "2024-01-01"}, [{"__bgq__": 1}], {"outer": {"__bgq__": "x"}}],
)
def test_reserved_tag_key_is_refused(parameters):
    """A user dict that looks like a tagged value would decode as something else: refuse it."""
    with pytest.raises(SerializationError, match="reserved"):
        encode(parameters, allow_pickle=False)


def test_reserved_tag_key_goes_to_pickle_when_allowed():
    stored_json, stored_pickle = encode([{"__bgq__": "date", "v": "2024-01-01"}], allow_pickle=True)
    # It cannot go to JSON; with pickle allowed it goes to the binary column and round-trips exactly.
    assert stored_json is None
    assert decode(None, stored_pickle, allow_pickle=True) == [{"__bgq__": "date", "v": "2024-01-01"}]


def test_unknown_tag_on_decode_is_an_error():
    with pytest.raises(ValueError, match="Unknown bgq parameter tag"):
        decode(json.dumps([{"__bgq__": "uuid", "v": "x"}]), None, allow_pickle=False)


def test_plain_dict_without_tag_decodes_as_dict():
    assert decode('[{"v": "2024-01-01", "kind": "date"}]', None, allow_pickle=False) == [
        {"v": "2024-01-01", "kind": "date"}
    ]


def test_decode_accepts_json_already_parsed_by_the_driver():
    """psycopg hands a JSON column back parsed; the tags must still be rehydrated."""
    stored_json, _ = encode([dt.date(2024, 5, 6), {"d": Decimal("2.50")}], allow_pickle=False)
    parsed = json.loads(stored_json)
    assert decode(parsed, None, allow_pickle=False) == [dt.date(2024, 5, 6), {"d": Decimal("2.50")}]


# --- pickle ---


def test_pickle_only_when_allowed():
    parameters = [Point(1, 2), {"s": {1, 2}}]
    stored_json, stored_pickle = encode(parameters, allow_pickle=True)
    assert stored_json is None
    assert isinstance(stored_pickle, bytes)
    assert decode(None, stored_pickle, allow_pickle=True) == parameters


def test_json_preferred_even_when_pickle_allowed():
    stored_json, stored_pickle = encode([1, {"a": dt.date(2024, 1, 1)}], allow_pickle=True)
    assert stored_pickle is None
    assert stored_json is not None


def test_pickle_refused_on_decode_without_allow_pickle():
    stored = pickle.dumps([Point(1, 2)])
    with pytest.raises(SerializationError, match="allow_pickle"):
        decode(None, stored, allow_pickle=False)


def test_pickle_decode_accepts_memoryview():
    stored = pickle.dumps([Point(3, 4)])
    assert decode(None, memoryview(stored), allow_pickle=True) == [Point(3, 4)]


def test_json_column_wins_over_pickle_column():
    assert decode("[1]", pickle.dumps([2]), allow_pickle=True) == [1]


@pytest.mark.parametrize(
    "value",
    [threading.Lock(), lambda: None, (x for x in ())],
    ids=["lock", "lambda", "generator"],
)
def test_unpicklable_value_with_pickle_allowed_is_a_serialization_error(value):
    """allow_pickle=True does not make everything storable: the error must still be typed."""
    with pytest.raises(SerializationError):
        encode([value], allow_pickle=True)


def test_serialization_error_is_a_type_error():
    with pytest.raises(TypeError):
        encode([object()], allow_pickle=False)
