"""Publish-time limits and faithful parameters: size, Unicode, NUL and time zones, on both dialects."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from bgq import ConfigError, PublishError, Queue, SerializationError
from bgq.config import DEFAULT_MAX_PARAMETERS_BYTES
from bgq.jobs import params as params_codec
from tests.support.helpers import count_rows

PRAGUE = ZoneInfo("Europe/Prague")


def stored_parameters(queue: Queue, job_id: int):
    row = queue.get_job(job_id)
    assert row is not None
    allow = queue.config.allow_pickle
    return params_codec.decode(row["parameters_json"], row["parameters"], allow_pickle=allow)


# --- size ---


def test_the_default_maximum_is_one_mib_and_documented():
    assert DEFAULT_MAX_PARAMETERS_BYTES == 1024 * 1024
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "| `max_parameters_bytes` | `1048576` (1 MiB) |" in readme


def test_max_parameters_bytes_is_the_exact_bound(make_queue, installed):
    queue = make_queue(max_parameters_bytes=100)
    fits = ["x" * 96]  # ["xxx…"]: 96 + 4 bytes of JSON
    assert params_codec.encoded_size(*params_codec.encode(fits, allow_pickle=False)) == 100
    job = queue.publish("noop", fits)
    assert stored_parameters(queue, job) == fits
    with pytest.raises(PublishError, match=r"take 101 bytes encoded, more than max_parameters_bytes \(100\)"):
        queue.publish("noop", ["x" * 97])
    assert count_rows(installed) == 1


def test_parameters_just_under_the_default_are_stored_whole(make_queue, installed):
    queue = make_queue()
    big = ["x" * (DEFAULT_MAX_PARAMETERS_BYTES - 4)]
    job = queue.publish("noop", big)
    assert stored_parameters(queue, job) == big


def test_pickled_parameters_count_their_pickle_bytes(make_queue, installed):
    queue = make_queue(allow_pickle=True, max_parameters_bytes=1000)
    with pytest.raises(PublishError, match="more than max_parameters_bytes"):
        queue.publish("noop", [{1, 2, 3}, b"x" * 1000])  # a set: not JSON, pickled
    assert count_rows(installed) == 0


def test_a_bulk_larger_than_max_allowed_packet_is_inserted_in_several_statements(make_queue, installed):
    """20 jobs of ~0.9 MiB each (18 MiB) in one bulk: more than MariaDB's default 16 MiB packet."""
    queue = make_queue(bulk_size=20)
    payload = "y" * (900 * 1024)
    with queue.bulk() as batch:
        for i in range(20):
            queue.publish("noop", [i, payload])
    assert len(batch.ids) == 20 and count_rows(installed) == 20
    assert stored_parameters(queue, batch.ids[-1]) == [19, payload]


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "1"])
def test_max_parameters_bytes_must_be_a_positive_integer(value):
    with pytest.raises(ConfigError, match="max_parameters_bytes"):
        Queue(callbacks={"noop": lambda: None}, database_url="sqlite://", max_parameters_bytes=value)


# --- NUL and lone surrogates ---


def test_nul_inside_parameters_is_the_same_on_both_dialects(make_queue, installed):
    """Inside JSON a NUL is the escape \\u0000: stored and returned unchanged on both."""
    queue = make_queue()
    job = queue.publish("noop", {"text": "a\x00b"})
    assert stored_parameters(queue, job) == {"text": "a\x00b"}


@pytest.mark.parametrize("name", ["a\x00b", "a\ud800"])
def test_a_callback_name_with_nul_or_a_lone_surrogate_is_a_config_error(name):
    with pytest.raises(ConfigError, match="NUL or lone surrogate"):
        Queue(callbacks={name: lambda: None}, database_url="sqlite://")


def test_a_lone_surrogate_is_pickled_when_pickle_is_allowed(make_queue, installed):
    queue = make_queue(allow_pickle=True)
    job = queue.publish("noop", ["\ud800"])
    row = queue.get_job(job)
    assert row["parameters_json"] is None and stored_parameters(queue, job) == ["\ud800"]


# --- time zones: kept by name, never silently a fixed offset ---


@pytest.mark.parametrize(
    "when",
    [
        dt.datetime(2026, 7, 1, 12, 0, 0, 123456, tzinfo=PRAGUE),  # summer time, +02:00
        dt.datetime(2026, 1, 15, 8, 30, tzinfo=PRAGUE),  # winter time, +01:00
        dt.datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=PRAGUE),  # the repeated hour, second pass
        dt.datetime(2026, 3, 1, 9, 0, tzinfo=ZoneInfo("UTC")),
    ],
    ids=["summer", "winter", "fold", "zoneinfo_utc"],
)
def test_a_zoneinfo_datetime_comes_back_in_its_zone(make_queue, installed, when):
    queue = make_queue()
    job = queue.publish("noop", {"when": when})
    back = stored_parameters(queue, job)["when"]
    assert back == when and back.tzinfo is when.tzinfo and back.fold == when.fold
    assert back.utcoffset() == when.utcoffset()
    # Still DST-aware: half a year later the offset is the zone's, not the stored one.
    later = back + dt.timedelta(days=182)
    assert later.utcoffset() == (when + dt.timedelta(days=182)).utcoffset()


def test_fixed_offsets_and_naive_values_are_stored_as_before(make_queue, installed):
    queue = make_queue()
    values = [
        dt.datetime(2026, 7, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
        dt.datetime(2026, 7, 1, 12, 0, tzinfo=dt.UTC),
        dt.datetime(2026, 7, 1, 12, 0),
        dt.time(8, 0, tzinfo=dt.timezone(dt.timedelta(hours=-3))),
    ]
    job = queue.publish("noop", values)
    back = stored_parameters(queue, job)
    assert back == values and [v.tzinfo for v in back] == [v.tzinfo for v in values]
    raw = json.dumps(queue.get_job(job)["parameters_json"])
    assert '\\"tz\\"' not in raw and '"tz"' not in raw


def test_a_zoneinfo_time_keeps_its_zone(make_queue, installed):
    queue = make_queue()
    job = queue.publish("noop", [dt.time(7, 45, tzinfo=PRAGUE)])
    (back,) = stored_parameters(queue, job)
    assert back == dt.time(7, 45, tzinfo=PRAGUE) and back.tzinfo is PRAGUE


class _OddZone(dt.tzinfo):
    """A tzinfo that is neither a ZoneInfo nor a fixed datetime.timezone (as pytz's or dateutil's)."""

    def utcoffset(self, value):
        return dt.timedelta(hours=1)

    def dst(self, value):
        return dt.timedelta(0)

    def tzname(self, value):
        return "ODD"

    def __reduce__(self):
        return (_OddZone, ())


def test_another_tzinfo_is_refused_with_a_clear_message(make_queue, installed):
    queue = make_queue()
    with pytest.raises(SerializationError, match="time zone of type _OddZone.*zoneinfo.ZoneInfo"):
        queue.publish("noop", [dt.datetime(2026, 7, 1, 12, 0, tzinfo=_OddZone())])
    assert count_rows(installed) == 0


def test_rows_written_before_zones_were_kept_still_decode():
    old = '[{"__bgq__":"datetime","v":"2026-07-01T12:00:00+02:00"}]'
    (value,) = params_codec.decode(old, None, allow_pickle=False)
    assert value == dt.datetime(2026, 7, 1, 10, 0, tzinfo=dt.UTC)
