"""Queue(...) configuration: validation errors (ConfigError) and defaults. Pure Python, no database."""

from __future__ import annotations

import logging

import pytest

import bgq
from bgq import ConfigError, Queue
from bgq.config import DEFAULT_PERMANENT_ERRORS, build_config


def noop(*args, **kwargs):
    return None


def make(**options):
    """A Queue with a valid default config; options override it. Never touches a database."""
    options.setdefault("callbacks", {"noop": noop})
    options.setdefault("database_url", "mysql+pymysql://nobody@127.0.0.1:1/never")
    return Queue(**options)


# --- priorities (checklist 7) ---


def test_checklist_07_duplicate_priorities():
    with pytest.raises(ConfigError) as info:
        make(priorities=[1, 1])
    assert str(info.value) == "There are duplicates priority in priorities list: 1,1"


def test_checklist_07_duplicate_priorities_lists_every_value():
    with pytest.raises(ConfigError) as info:
        make(priorities=[3, 1, 2, 3])
    assert str(info.value) == "There are duplicates priority in priorities list: 3,1,2,3"


@pytest.mark.parametrize(
    ("priorities", "listing"),
    [([-1], "-1"), ([1000], "1000"), ([1, 2, 1000], "1,2,1000"), ([-5, 0, 999], "-5,0,999")],
)
def test_checklist_07_priorities_out_of_range(priorities, listing):
    with pytest.raises(ConfigError) as info:
        make(priorities=priorities)
    assert str(info.value) == f"There are value out of range 0-999 in priorities list: {listing}"


def test_checklist_07_boundary_priorities_are_accepted():
    queue = make(priorities=[0, 999], callbacks={"noop": noop})
    assert queue.config.priorities == (0, 999)


def test_priority_0_with_a_producer_is_refused_and_1_to_999_are_taken():
    """Broker mode's <queue>_0 is the control queue: every priority-0 send would fail."""
    from bgq.broker.rabbitmq import RabbitMQ

    producer = RabbitMQ("amqp://guest:guest@127.0.0.1:1/")  # never connects here
    with pytest.raises(ConfigError, match="Priority 0 cannot be used with a producer"):
        make(priorities=[0, 1], producer=producer)
    assert make(priorities=[1, 999], producer=producer).config.priorities == (1, 999)


@pytest.mark.parametrize("priorities", [[], (), None, "12", {1, 2}, 1])
def test_empty_or_non_list_priorities(priorities):
    with pytest.raises(ConfigError, match="priorities"):
        make(priorities=priorities)


@pytest.mark.parametrize("priorities", [[1, "2"], [1.0], [True]])
def test_non_integer_priorities(priorities):
    with pytest.raises(ConfigError, match="priorities"):
        make(priorities=priorities)


def test_priorities_keep_their_order():
    """The list order matters: the first element is the default priority."""
    assert make(priorities=[5, 1, 3]).config.priorities == (5, 1, 3)


# --- names ---


@pytest.mark.parametrize(
    "table",
    ["bad-name", "1abc", "x;drop", "a" * 41, "", "a b", "ünïcode", "abc\n", None, 5],
)
def test_invalid_table_name(table):
    with pytest.raises(ConfigError, match="Invalid table name"):
        make(table_name=table)


@pytest.mark.parametrize("table", ["a", "_jobs", "Background_Job2", "a" * 40])
def test_valid_table_name(table):
    assert make(table_name=table).config.table_name == table


@pytest.mark.parametrize("queue", ["", "a b", "x;drop", "_leading", "-leading", "a" * 201, "general\n", None])
def test_invalid_queue_name(queue):
    with pytest.raises(ConfigError, match="Invalid queue name"):
        make(queue=queue)


@pytest.mark.parametrize("queue", ["general", "app.jobs", "app-jobs_1", "a" * 200])
def test_valid_queue_name(queue):
    assert make(queue=queue).config.queue == queue


# --- other options ---


@pytest.mark.parametrize("bulk", [0, -1, True, "2", 1.5])
def test_invalid_bulk_size(bulk):
    with pytest.raises(ConfigError, match="bulk_size"):
        make(bulk_size=bulk)


def test_unknown_option():
    with pytest.raises(ConfigError) as info:
        make(waitingQueue="x", tableName="t")
    assert str(info.value) == "Unknown option(s): tableName, waitingQueue."


def test_callbacks_are_optional_for_tasks():
    """`@queue.task` registers callbacks after the Queue is built: the option may be left out."""
    queue = Queue(database_url="mysql+pymysql://nobody@127.0.0.1:1/never")
    assert dict(queue.config.callbacks) == {}


@pytest.mark.parametrize(
    "hook", ["on_before_process", "on_after_process", "on_error", "on_processing_get_metadata"]
)
def test_non_callable_hook(hook):
    with pytest.raises(ConfigError, match=hook):
        make(**{hook: 42})


def test_hooks_may_be_none_or_callable():
    queue = make(on_error=None, on_before_process=noop)
    assert queue.config.on_error is None
    assert queue.config.on_before_process is noop


@pytest.mark.parametrize("name", ["waiting_job_expiration", "stalled_job_timeout", "heartbeat_interval"])
@pytest.mark.parametrize("value", [-1, "10", 1.5, True])
def test_invalid_non_negative_int_options(name, value):
    with pytest.raises(ConfigError, match=name):
        make(**{name: value})


def test_logger_must_be_a_logger():
    with pytest.raises(ConfigError, match="logger"):
        make(logger=print)


def test_permanent_errors_must_be_exception_classes():
    with pytest.raises(ConfigError, match="permanent_errors"):
        make(permanent_errors=[TypeError])
    with pytest.raises(ConfigError, match="permanent_errors"):
        make(permanent_errors=(TypeError, "ValueError"))


# --- callbacks ---


@pytest.mark.parametrize("callbacks", [[noop], noop, "noop", None])
def test_callbacks_not_a_mapping(callbacks):
    with pytest.raises(ConfigError, match="callbacks"):
        make(callbacks=callbacks)


@pytest.mark.parametrize(
    "entry",
    [42, "noop", {"queue": "sub"}, {"callback": "noop"}, {"callback": None, "priority": 1}],
)
def test_callback_entry_without_callable(entry):
    with pytest.raises(ConfigError) as info:
        make(callbacks={"job": entry})
    assert 'Callback "job" must be a callable or a mapping with a callable "callback"' in str(info.value)


def test_callback_entry_with_unknown_keys():
    with pytest.raises(ConfigError, match='Callback "job" has unknown keys: prio'):
        make(callbacks={"job": {"callback": noop, "prio": 1}})


@pytest.mark.parametrize("name", ["", 5, "x" * 256])
def test_invalid_callback_name(name):
    with pytest.raises(ConfigError, match="Callback name"):
        make(callbacks={name: noop})


def test_callback_priority_not_in_priorities():
    with pytest.raises(ConfigError) as info:
        make(callbacks={"job": {"callback": noop, "priority": 3}}, priorities=[1, 2])
    assert str(info.value) == 'Callback "job" has priority 3, which is not in priorities 1,2.'


def test_callback_priority_must_not_be_a_bool():
    """True == 1, but publish() refuses a bool priority; the config must refuse it up front."""
    with pytest.raises(ConfigError, match='Callback "job" has priority True'):
        make(callbacks={"job": {"callback": noop, "priority": True}}, priorities=[1, 2])


@pytest.mark.parametrize("sub", ["5", "10", "0"])
def test_numeric_sub_queue(sub):
    with pytest.raises(ConfigError, match="numeric queue"):
        make(callbacks={"job": {"callback": noop, "queue": sub}})


@pytest.mark.parametrize("sub", ["", "a b", "x;y", 5])
def test_invalid_sub_queue(sub):
    with pytest.raises(ConfigError, match="invalid queue"):
        make(callbacks={"job": {"callback": noop, "queue": sub}})


def test_callback_specs():
    queue = make(
        callbacks={"plain": noop, "full": {"callback": noop, "queue": "mail", "priority": 2}},
        priorities=[1, 2],
        queue="general",
    )
    plain, full = queue.config.callbacks["plain"], queue.config.callbacks["full"]
    assert (plain.func, plain.queue, plain.priority) == (noop, None, None)
    assert (full.func, full.queue, full.priority) == (noop, "mail", 2)
    assert queue.config.queue_name(plain.queue) == "general"
    assert queue.config.queue_name(full.queue) == "general_mail"


# --- defaults ---


def test_defaults():
    config = build_config(callbacks={"noop": noop}, database_url="mysql+pymysql://x@h/db")
    assert config.priorities == (1,)
    assert config.table_name == "background_job"
    assert config.queue == "default"
    assert config.bulk_size == 1
    assert config.waiting_job_expiration == 1000
    assert config.stalled_job_timeout == 3600
    assert config.heartbeat_interval == 60
    assert config.lost_message_timeout == 3600
    assert config.notify_on_number_of_attempts is None
    assert config.producer is None
    assert config.allow_pickle is False
    assert config.permanent_errors == DEFAULT_PERMANENT_ERRORS
    assert isinstance(config.logger, logging.Logger)
    assert config.logger.name == "bgq"


def test_waiting_job_expiration_zero_means_default():
    assert make(waiting_job_expiration=0).config.waiting_job_expiration == 1000
    assert make(waiting_job_expiration=250).config.waiting_job_expiration == 250


def test_explicit_zero_disables_timeouts():
    config = make(stalled_job_timeout=0, lost_message_timeout=0, heartbeat_interval=0).config
    assert (config.stalled_job_timeout, config.lost_message_timeout, config.heartbeat_interval) == (0, 0, 0)


@pytest.mark.parametrize(("value", "expected"), [(None, None), (False, None), (0, None), (3, 3)])
def test_notify_on_number_of_attempts(value, expected):
    assert make(notify_on_number_of_attempts=value).config.notify_on_number_of_attempts == expected


def test_database_url_from_environment(monkeypatch):
    monkeypatch.setenv("BGQ_DATABASE_URL", "postgresql+psycopg://env@127.0.0.1/envdb")
    queue = Queue(callbacks={"noop": noop})
    assert queue.config.database_url == "postgresql+psycopg://env@127.0.0.1/envdb"


def test_explicit_database_url_wins_over_environment(monkeypatch):
    monkeypatch.setenv("BGQ_DATABASE_URL", "postgresql+psycopg://env@127.0.0.1/envdb")
    queue = Queue(callbacks={"noop": noop}, database_url="mysql+pymysql://app@127.0.0.1/appdb")
    assert queue.config.database_url == "mysql+pymysql://app@127.0.0.1/appdb"


def test_no_database_url_anywhere(monkeypatch):
    monkeypatch.delenv("BGQ_DATABASE_URL", raising=False)
    assert Queue(callbacks={"noop": noop}).config.database_url is None


def test_construction_does_not_connect():
    """A Queue on an unreachable database can be built: connecting is deferred to first use."""
    queue = make(database_url="mysql+pymysql://nobody@127.0.0.1:1/never")
    assert not queue.store.opened


def test_config_error_is_a_bgq_error_and_value_error():
    with pytest.raises(bgq.BgqError):
        make(bulk_size=0)
    with pytest.raises(ValueError):
        make(bulk_size=0)


# --- database_url ---


@pytest.mark.parametrize(
    "url, says",
    [
        ("sqlite:///x.db", "Unsupported database 'sqlite'"),
        ("oracle://scott@db/x", "Unsupported database 'oracle'"),
        ("not a url", "Invalid database URL"),
    ],
)
def test_a_database_url_bgq_cannot_use_is_refused_when_the_queue_is_built(url, says):
    """Not at the first publish, deep in a request: at Queue(...), naming the option."""
    with pytest.raises(ConfigError, match=f'Option "database_url": {says}'):
        make(database_url=url)


@pytest.mark.parametrize(
    "url, driver",
    [
        ("postgres://u@h/db", "postgresql+psycopg"),  # the form many hosting platforms hand out
        ("postgresql://u@h/db", "postgresql+psycopg"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg"),
        ("mysql://u@h/db", "mysql+pymysql"),
        ("mariadb://u@h/db", "mariadb+pymysql"),
    ],
)
def test_a_database_url_without_bgq_s_driver_gets_it(url, driver):
    assert make(database_url=url).database.url.drivername == driver  # builds the engine, no connect
