"""publish(): bad input is a typed error before anything is written; good input is stored as SPEC §1.1 says.

Parametrised over both dialects (the `installed` fixture). Test names carry SPEC checklist numbers.
"""

from __future__ import annotations

import datetime as dt
import json
import pickle
from decimal import Decimal

import pytest

from bgq import (
    JobState,
    Mode,
    PriorityError,
    PublishError,
    SerializationError,
    UnknownCallbackError,
)
from tests.support.helpers import count_rows, state_of

UTC = dt.UTC


def noop(*args, **kwargs):
    return None


def row_of(installed, job_id: int) -> dict:
    (row,) = installed.sql("SELECT * FROM {t} WHERE id = %s", (job_id,))
    return row


def as_utc(value: dt.datetime) -> dt.datetime:
    """MySQL DATETIME(6) comes back naive (it is UTC); PostgreSQL timestamptz comes back aware."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def stored_json(value):
    """A JSON column as Python data: MariaDB hands back text, psycopg hands back parsed JSON."""
    if value is None:
        return None
    return json.loads(value) if isinstance(value, str | bytes) else value


# --- bad input: typed error, exact message, nothing written (checklist 1-5) ---

BAD_PUBLISHES = [
    pytest.param(
        ("",),
        {},
        PublishError,
        'The job does not have the required parameter "callback_name" set.',
        id="checklist_02_empty_callback_name",
    ),
    pytest.param(
        (None,),
        {},
        PublishError,
        'The job does not have the required parameter "callback_name" set.',
        id="checklist_02_none_callback_name",
    ),
    pytest.param(
        ("x",),
        {},
        UnknownCallbackError,
        'Callback "x" does not exist.',
        id="checklist_01_unknown_callback",
    ),
    pytest.param(
        ("noop",),
        {"mode": Mode.UNIQUE},
        PublishError,
        'Parameter "identifier" has to be set if "mode" is unique.',
        id="checklist_03_unique_without_identifier",
    ),
    pytest.param(
        ("noop",),
        {"mode": "unique", "identifier": ""},
        PublishError,
        'Parameter "identifier" has to be set if "mode" is unique.',
        id="checklist_03_unique_with_empty_identifier",
    ),
    pytest.param(
        ("noop",),
        {"mode": Mode.RECURRING},
        PublishError,
        'Parameter "identifier" has to be set if "mode" is recurring.',
        id="checklist_03_recurring_without_identifier",
    ),
    pytest.param(
        ("noop",),
        {"priority": 5},
        PriorityError,
        "Priority 5 for callback noop is not in available priorities: 1,2",
        id="checklist_05_priority_not_in_list",
    ),
    pytest.param(
        ("noop",),
        {"priority": 0},
        PriorityError,
        "Priority 0 for callback noop is not in available priorities: 1,2",
        id="checklist_05_priority_zero_not_in_list",
    ),
    pytest.param(
        ("noop",),
        {"priority": True},
        PriorityError,
        "Priority True for callback noop is a bool: priorities are integers (1,2).",
        id="checklist_05_priority_bool",
    ),
    pytest.param(
        ("noop",),
        {"priority": "1"},
        PriorityError,
        "Priority '1' for callback noop is a string: priorities are integers (1,2).",
        id="checklist_05_priority_str",
    ),
    pytest.param(
        ("noop",),
        {"priority": 1.0},
        PriorityError,
        "Priority 1.0 for callback noop is a float: priorities are integers (1,2).",
        id="priority_float",
    ),
    pytest.param(
        ("noop",),
        {"serial_group": "a\x00b"},
        PublishError,
        "Parameter \"serial_group\" must not contain NUL or lone surrogate characters: 'a\\x00b'.",
        id="serial_group_nul",
    ),
    pytest.param(
        ("noop",),
        {"identifier": "a\x00b", "mode": "unique"},
        PublishError,
        "Parameter \"identifier\" must not contain NUL or lone surrogate characters: 'a\\x00b'.",
        id="identifier_nul",
    ),
    pytest.param(
        ("noop",),
        {"serial_group": "a\ud800"},
        PublishError,
        "Parameter \"serial_group\" must not contain NUL or lone surrogate characters: 'a\\ud800'.",
        id="serial_group_lone_surrogate",
    ),
    pytest.param(
        ("noop", ["\ud800"]),
        {},
        SerializationError,
        "Parameters contain a string that is not valid Unicode ('\\ud800', a lone surrogate), "
        "which cannot be stored as JSON text.",
        id="parameters_lone_surrogate",
    ),
    pytest.param(
        ("noop", {"k\udfff": 1}),
        {},
        SerializationError,
        "Parameters contain a string that is not valid Unicode ('\\udfff', a lone surrogate), "
        "which cannot be stored as JSON text.",
        id="parameter_key_lone_surrogate",
    ),
    pytest.param(
        ("noop", ["x" * (16 * 1024 * 1024)]),
        {},
        PublishError,
        "The parameters take 16777220 bytes encoded, more than max_parameters_bytes (1048576): "
        "store large data elsewhere and pass a reference.",
        id="parameters_16_mib_over_max_allowed_packet",
    ),
    pytest.param(
        ("noop", ["é" * (512 * 1024)]),
        {},
        PublishError,
        "The parameters take 1048580 bytes encoded, more than max_parameters_bytes (1048576): "
        "store large data elsewhere and pass a reference.",
        id="parameters_over_1_mib_in_utf8_bytes",
    ),
    pytest.param(
        ("noop",),
        {"serial_group": "g" * 256},
        PublishError,
        'Parameter "serial_group" must be a non-empty string of at most 255 characters.',
        id="serial_group_too_long",
    ),
    pytest.param(
        ("noop",),
        {"serial_group": ""},
        PublishError,
        'Parameter "serial_group" must be a non-empty string of at most 255 characters.',
        id="serial_group_empty",
    ),
    pytest.param(
        ("noop",),
        {"serial_group": 42},
        PublishError,
        'Parameter "serial_group" must be a non-empty string of at most 255 characters.',
        id="serial_group_not_str",
    ),
    pytest.param(
        ("noop",),
        {"identifier": "i" * 256},
        PublishError,
        'Parameter "identifier" must be a non-empty string of at most 255 characters.',
        id="identifier_too_long",
    ),
    pytest.param(
        ("noop",),
        {"serial_group": "g", "coalesce_threshold": "5"},
        PublishError,
        'Parameter "coalesce_threshold" must be a 64-bit integer.',
        id="coalesce_threshold_not_int",
    ),
    pytest.param(
        ("noop",),
        {"serial_group": "g", "coalesce_threshold": 2**63},
        PublishError,
        'Parameter "coalesce_threshold" must be a 64-bit integer.',
        id="coalesce_threshold_above_bigint",
    ),
    pytest.param(
        ("noop",),
        {"serial_group": "g", "coalesce_threshold": -(2**63) - 1},
        PublishError,
        'Parameter "coalesce_threshold" must be a 64-bit integer.',
        id="coalesce_threshold_below_bigint",
    ),
    pytest.param(
        ("noop",),
        {"mode": "sometimes"},
        PublishError,
        "Unknown mode 'sometimes': use normal, unique or recurring.",
        id="bad_mode",
    ),
    pytest.param(
        ("noop",),
        {"postpone_by": -1},
        PublishError,
        'Parameter "postpone_by" must be 0..2147483647 ms or a timedelta, got -1.',
        id="postpone_by_negative",
    ),
    pytest.param(
        ("noop",),
        {"postpone_by": dt.timedelta(seconds=-1)},
        PublishError,
        'Parameter "postpone_by" must be 0..2147483647 ms or a timedelta, got -1000.',
        id="postpone_by_negative_timedelta",
    ),
    pytest.param(
        ("noop",),
        {"postpone_by": 2**31},
        PublishError,
        'Parameter "postpone_by" must be 0..2147483647 ms or a timedelta, got 2147483648.',
        id="postpone_by_too_large",
    ),
    pytest.param(
        ("noop",),
        {"postpone_by": 1.5},
        PublishError,
        'Parameter "postpone_by" must be 0..2147483647 ms or a timedelta, got 1.5.',
        id="postpone_by_float",
    ),
]


@pytest.mark.parametrize(("args", "kwargs", "error", "message"), BAD_PUBLISHES)
def test_bad_publish_raises_typed_error_and_writes_nothing(
    make_queue, installed, args, kwargs, error, message
):
    queue = make_queue(priorities=[1, 2])
    with pytest.raises(error) as info:
        queue.publish(*args, **kwargs)
    assert type(info.value) is error
    assert str(info.value) == message
    assert count_rows(installed) == 0


def test_checklist_04_coalesce_threshold_without_serial_group(make_queue, installed):
    queue = make_queue()
    with pytest.raises(PublishError, match="coalesce"):
        queue.publish("noop", coalesce_threshold=5)
    with pytest.raises(PublishError, match="coalesce"):
        queue.publish("noop", coalesce_threshold=5, serial_group="")
    assert count_rows(installed) == 0


def test_checklist_04_coalesce_message_names_the_python_parameters(make_queue, installed):
    """Part A: snake_case everywhere; the message must name parameters publish() actually has."""
    queue = make_queue()
    with pytest.raises(PublishError) as info:
        queue.publish("noop", coalesce_threshold=5)
    assert str(info.value) == 'Parameter "serial_group" has to be set if "coalesce_threshold" is used.'


def _nested(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "parameters",
    [
        [object()],
        [{1, 2}],
        [b"raw bytes"],
        [float("nan")],
        [float("inf")],
        {1: "non-str key"},
        [{"nested": {2: "non-str key"}}],
        [{"__bgq__": "date", "v": "2024-01-01"}],
        "not a list",
        42,
        [_nested(5000)],
    ],
    ids=[
        "object",
        "set",
        "bytes",
        "nan",
        "inf",
        "int_key",
        "nested_int_key",
        "reserved_key",
        "str",
        "int",
        "nested_5000_deep",
    ],
)
def test_unserialisable_parameters_raise_and_write_nothing(make_queue, installed, parameters):
    queue = make_queue()
    with pytest.raises(SerializationError):
        queue.publish("noop", parameters)
    assert count_rows(installed) == 0


def test_checklist_01_nothing_written_but_good_publish_still_works(make_queue, installed):
    """The row counter really sees rows: the same queue publishes fine after the errors."""
    queue = make_queue()
    with pytest.raises(UnknownCallbackError):
        queue.publish("missing")
    job_id = queue.publish("noop")
    assert isinstance(job_id, int)
    assert count_rows(installed) == 1


def test_boundary_lengths_are_accepted(make_queue, installed):
    queue = make_queue()
    group, identifier = "ž" * 255, "🎉" * 255
    job_id = queue.publish("noop", serial_group=group, identifier=identifier)
    row = row_of(installed, job_id)
    assert row["serial_group"] == group
    assert row["identifier"] == identifier


# --- the positive side ---


def test_checklist_06_priority_resolution(make_queue, installed):
    """Explicit > the callback's priority > the FIRST element of priorities (not the lowest)."""
    queue = make_queue(
        callbacks={"plain": noop, "configured": {"callback": noop, "priority": 2}},
        priorities=[3, 1, 2],
    )
    cases = {
        queue.publish("plain"): 3,
        queue.publish("configured"): 2,
        queue.publish("configured", priority=1): 1,
        queue.publish("plain", priority=2): 2,
        queue.publish("configured", priority=3): 3,
    }
    for job_id, expected in cases.items():
        assert row_of(installed, job_id)["priority"] == expected


def test_checklist_08_new_job_is_ready(make_queue, installed):
    queue = make_queue()
    before = dt.datetime.now(UTC)
    job_id = queue.publish("noop", [1], serial_group="grp", identifier="ident", mode="unique")
    after = dt.datetime.now(UTC)
    row = row_of(installed, job_id)
    assert row["state"] == JobState.READY
    assert row["number_of_attempts"] == 0
    assert row["mode"] == "unique"
    assert row["queue"] == "general"
    assert row["callback_name"] == "noop"
    assert row["serial_group"] == "grp"
    assert row["identifier"] == "ident"
    slack = dt.timedelta(seconds=5)  # the database server's clock, not ours
    assert before - slack <= as_utc(row["created_at"]) <= after + slack
    for column in (
        "last_attempt_at",
        "finished_at",
        "pid",
        "error_message",
        "execution_time",
        "metadata",
        "memory",
    ):
        assert row[column] is None, column
    assert row["processed_by_broker"] == 0  # cron mode: no producer
    assert row["coalesce_threshold"] is None
    assert row["postponed_by"] is None


def test_checklist_08_created_at_equals_updated_at(make_queue, installed):
    """One clock reading per insert. (Two readings differ by a microsecond now and then, so
    publish enough jobs that a per-column clock would show.)"""
    queue = make_queue()
    for _ in range(100):
        queue.publish("noop")
    differing = installed.sql("SELECT id, created_at, updated_at FROM {t} WHERE created_at <> updated_at")
    assert differing == []


def test_checklist_08_default_mode_is_normal(make_queue, installed):
    job_id = make_queue().publish("noop")
    assert row_of(installed, job_id)["mode"] == "normal"


def test_checklist_08_coalesce_threshold_is_stored(make_queue, installed):
    job_id = make_queue().publish("noop", serial_group="g", coalesce_threshold=150)
    assert row_of(installed, job_id)["coalesce_threshold"] == 150


def test_checklist_08_timestamps_have_sub_second_precision(make_queue, installed, dialect):
    queue = make_queue()
    ids = [queue.publish("noop") for _ in range(3)]
    created = [as_utc(row_of(installed, i)["created_at"]) for i in ids]
    assert created == sorted(created)
    assert len(set(created)) == 3  # three publishes within a second are told apart
    assert any(c.microsecond != 0 for c in created)
    if dialect == "mysql":
        rows = installed.sql(
            "SELECT column_name AS c, datetime_precision AS p FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND table_name = %s",
            (installed.table,),
        )
    else:
        rows = installed.sql(
            "SELECT column_name AS c, datetime_precision AS p FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %s",
            (installed.table,),
        )
    precision = {r["c"].lower(): r["p"] for r in rows}
    for column in ("created_at", "updated_at", "last_attempt_at", "finished_at"):
        assert precision[column] == 6, column


def test_checklist_09_queue_and_sub_queue(make_queue, installed):
    queue = make_queue(callbacks={"plain": noop, "mail": {"callback": noop, "queue": "sub"}})
    assert row_of(installed, queue.publish("plain"))["queue"] == "general"
    assert row_of(installed, queue.publish("mail"))["queue"] == "general_sub"


def test_checklist_09_only_the_own_queue_and_its_sub_queues_are_processed(make_queue, installed):
    """Exact queue matching (Part A improvement 4): no bare prefix, no LIKE wildcard in the name."""
    ran = []

    def job(tag):
        ran.append(tag)

    callbacks = {"job": job, "sub": {"callback": job, "queue": "sub"}}
    general = make_queue(callbacks=callbacks, queue="general")
    in_sub = general.publish("sub", ["sub"])
    in_prefixed = make_queue(callbacks=callbacks, queue="generalx").publish("job", ["generalx"])
    in_wildcard = make_queue(callbacks=callbacks, queue="aXb").publish("sub", ["aXb_sub"])

    assert make_queue(callbacks=callbacks, queue="gen").process_job(in_sub) == "missing"
    assert general.process_job(in_prefixed) == "missing"
    assert make_queue(callbacks=callbacks, queue="a_b").process_job(in_wildcard) == "missing"
    assert ran == []
    assert {state_of(installed, i) for i in (in_sub, in_prefixed, in_wildcard)} == {JobState.READY}

    assert general.process_job(in_sub) == "claimed"
    assert ran == ["sub"]
    assert state_of(installed, in_sub) == JobState.FINISHED


@pytest.mark.parametrize(
    ("postpone_by", "stored"),
    [
        (None, None),
        (0, 0),
        (1500, 1500),
        (dt.timedelta(seconds=2), 2000),
        (dt.timedelta(minutes=5), 300_000),
        (dt.timedelta(milliseconds=250), 250),
        (2**31 - 1, 2**31 - 1),
    ],
    ids=str,
)
def test_checklist_10_postpone_by_stored_in_ms(make_queue, installed, postpone_by, stored):
    job_id = make_queue().publish("noop", postpone_by=postpone_by)
    assert row_of(installed, job_id)["postponed_by"] == stored


@pytest.mark.parametrize("ms", [1001, 1003, 1007])
def test_checklist_10_postpone_by_timedelta_is_exact_to_the_ms(make_queue, installed, ms):
    """timedelta(milliseconds=1001) is 1001 ms, not 1000 (no float truncation)."""
    job_id = make_queue().publish("noop", postpone_by=dt.timedelta(milliseconds=ms))
    assert row_of(installed, job_id)["postponed_by"] == ms


def test_checklist_18_json_parameters_use_the_json_column(make_queue, installed):
    parameters = [1, "two", {"three": [3.5, None, True]}, "kůň"]
    job_id = make_queue().publish("noop", parameters)
    row = row_of(installed, job_id)
    assert row["parameters"] is None
    assert stored_json(row["parameters_json"]) == parameters


def test_checklist_18_rich_values_are_still_json(make_queue, installed):
    job_id = make_queue().publish("noop", {"when": dt.date(2024, 1, 2), "amount": Decimal("1.10")})
    row = row_of(installed, job_id)
    assert row["parameters"] is None
    assert row["parameters_json"] is not None


def test_checklist_18_pickle_goes_to_the_binary_column_only_when_allowed(make_queue, installed):
    received = []
    queue = make_queue(callbacks={"take": lambda s: received.append(s)}, allow_pickle=True)
    job_id = queue.publish("take", [{1, 2, 3}])
    row = row_of(installed, job_id)
    assert row["parameters_json"] is None
    assert row["parameters"] is not None
    assert pickle.loads(bytes(row["parameters"])) == [{1, 2, 3}]

    assert queue.process_job(job_id) == "claimed"
    assert received == [{1, 2, 3}]
    assert state_of(installed, job_id) == JobState.FINISHED


def test_checklist_18_pickled_row_is_not_run_by_a_queue_without_allow_pickle(make_queue, installed):
    """Unpickling a shared table's rows is code execution: a queue without the opt-in refuses."""
    received = []
    callbacks = {"take": lambda s: received.append(s)}
    job_id = make_queue(callbacks=callbacks, allow_pickle=True).publish("take", [{1, 2}])
    assert make_queue(callbacks=callbacks).process_job(job_id) == "claimed"
    assert received == []
    row = row_of(installed, job_id)
    assert row["state"] == JobState.PERMANENTLY_FAILED
    assert "allow_pickle" in row["error_message"]


@pytest.mark.parametrize("parameters", [None, [], {}, ()], ids=["None", "list", "dict", "tuple"])
def test_checklist_19_empty_parameters_store_nothing_and_run_without_arguments(
    make_queue, installed, parameters
):
    calls = []

    def callback(*args, **kwargs):
        calls.append((args, kwargs))

    queue = make_queue(callbacks={"cb": callback})
    job_id = queue.publish("cb", parameters)
    row = row_of(installed, job_id)
    assert row["parameters"] is None
    assert row["parameters_json"] is None
    assert queue.process_job(job_id) == "claimed"
    assert calls == [((), {})]
    assert state_of(installed, job_id) == JobState.FINISHED


def test_checklist_20_datetimes_dates_and_decimals_survive_processing(make_queue, installed):
    received = []
    queue = make_queue(callbacks={"cb": lambda *args: received.append(args)})
    aware = dt.datetime(2024, 3, 31, 1, 59, 59, 999_999, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    naive = dt.datetime(2023, 12, 31, 23, 0, 0, 1)
    nested = {"day": dt.date(2024, 2, 29), "amount": Decimal("1.10"), "list": [Decimal("-0.001")]}
    job_id = queue.publish("cb", [aware, nested, naive])
    assert queue.process_job(job_id) == "claimed"
    assert state_of(installed, job_id) == JobState.FINISHED
    ((got_aware, got_nested, got_naive),) = received
    assert type(got_aware) is dt.datetime and got_aware == aware
    assert got_aware.utcoffset() == dt.timedelta(hours=2)
    assert type(got_naive) is dt.datetime and got_naive == naive and got_naive.tzinfo is None
    assert type(got_nested["day"]) is dt.date and got_nested["day"] == dt.date(2024, 2, 29)
    assert type(got_nested["amount"]) is Decimal and str(got_nested["amount"]) == "1.10"
    assert got_nested["list"] == [Decimal("-0.001")]


def test_checklist_21_list_is_positional_dict_is_keywords(make_queue, installed):
    calls = []

    def send(to, subject, text="(none)"):
        calls.append((to, subject, text))

    queue = make_queue(callbacks={"send": send})
    positional = queue.publish("send", ["a@example.com", "Hi"])
    as_tuple = queue.publish("send", ("b@example.com", "Yo", "body"))
    keywords = queue.publish("send", {"text": "body", "subject": "Hey", "to": "c@example.com"})
    for job_id in (positional, as_tuple, keywords):
        assert queue.process_job(job_id) == "claimed"
        assert state_of(installed, job_id) == JobState.FINISHED
    assert calls == [
        ("a@example.com", "Hi", "(none)"),
        ("b@example.com", "Yo", "body"),
        ("c@example.com", "Hey", "body"),
    ]


def test_checklist_21_unknown_keyword_is_a_permanent_failure(make_queue, installed):
    def send(to):
        raise AssertionError("must not run")

    queue = make_queue(callbacks={"send": send})
    job_id = queue.publish("send", {"recipient": "x"})
    assert queue.process_job(job_id) == "claimed"
    row = row_of(installed, job_id)
    assert row["state"] == JobState.PERMANENTLY_FAILED
    assert row["error_message"].startswith("TypeError")


@pytest.mark.parametrize("field", ["serial_group", "identifier"])
def test_trailing_whitespace_in_group_or_identifier_is_refused(make_queue, installed, field):
    """MySQL compares 'a ' and 'a' as equal, PostgreSQL does not: publish refuses the ambiguity."""
    queue = make_queue()
    with pytest.raises(PublishError, match="must not end with whitespace"):
        queue.publish("noop", **{field: "report "}, mode="unique" if field == "identifier" else "normal")
    assert installed.sql("SELECT COUNT(*) AS n FROM {t}")[0]["n"] == 0


def test_publish_refuses_a_connection_to_another_kind_of_database(make_queue, installed):
    import sqlalchemy as sa

    queue = make_queue()
    engine = sa.create_engine("sqlite://")
    try:
        with engine.connect() as conn, pytest.raises(PublishError, match="connection is sqlite"):
            queue.publish("noop", connection=conn)
    finally:
        engine.dispose()
    assert installed.sql("SELECT COUNT(*) AS n FROM {t}")[0]["n"] == 0


def test_coalesce_thresholds_at_the_bigint_bounds_are_stored(make_queue, installed):
    queue = make_queue()
    bounds = (2**63 - 1, -(2**63))
    ids = [queue.publish("noop", serial_group="g", coalesce_threshold=t) for t in bounds]
    rows = installed.sql("SELECT id, coalesce_threshold FROM {t} ORDER BY id")
    assert [(r["id"], r["coalesce_threshold"]) for r in rows] == list(zip(ids, bounds, strict=True))


@pytest.mark.dialect_differs(
    mysql="refused", postgres="stored", reason="MariaDB's JSON_VALID check refuses 32 levels of nesting"
)
def test_parameters_nested_40_levels_deep(make_queue, installed, dialect_expects):
    """Refused as a SerializationError where the server's JSON cannot hold them, not a DatabaseError."""
    queue = make_queue()
    deep = [_nested(40)]
    if dialect_expects == "refused":
        with pytest.raises(SerializationError, match="31 levels"):
            queue.publish("noop", deep)
        assert count_rows(installed) == 0
    else:
        job_id = queue.publish("noop", deep)
        (row,) = installed.sql("SELECT parameters_json FROM {t} WHERE id = %s", (job_id,))
        stored = row["parameters_json"]
        assert (json.loads(stored) if isinstance(stored, str) else stored) == deep
