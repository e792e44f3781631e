"""The private APIs of dependencies bgq uses on purpose, each in one place: these fail loudly the day
PyMySQL or pika renames or reshapes them (bgq/db/mysql.py PyMySQLInternals, bgq/broker/rabbitmq.py
_ioloop_timer), instead of bgq breaking quietly on a minor upgrade."""

from __future__ import annotations

import inspect
import time

import pika
import pymysql
import pytest

from bgq.broker.rabbitmq import _ioloop_timer
from bgq.db import Database
from bgq.db.mysql import PyMySQLInternals
from tests.conftest import AMQP_URL, DATABASE_URLS, SERVICE_NAMES, _probe_database, require_service

# --- PyMySQL ---


@pytest.mark.parametrize("name", ["_execute_command", "_read_query_result"])
def test_pymysql_still_has_the_two_halves_of_a_query(name):
    method = getattr(pymysql.connections.Connection, name, None)
    assert callable(method), f"PyMySQL {pymysql.__version__} has no Connection.{name}: see PyMySQLInternals"
    if name == "_execute_command":
        assert list(inspect.signature(method).parameters)[:3] == ["self", "command", "sql"]


def test_pymysql_internals_name_every_private_attribute_they_use():
    source = inspect.getsource(PyMySQLInternals)
    used = {
        word
        for word in ("_execute_command", "_read_query_result", "_result", "_sock")
        if f".{word}" in source
    }
    assert used == set(PyMySQLInternals.NAMES)


@pytest.fixture
def mysql_db():
    require_service(SERVICE_NAMES["mysql"], _probe_database(DATABASE_URLS["mysql"]))
    db = Database(DATABASE_URLS["mysql"])
    yield db
    db.dispose()


def test_pymysql_internals_send_then_read_on_a_real_connection(mysql_db):
    conn = mysql_db.detached()
    try:
        internals = PyMySQLInternals(conn)
        assert internals.fileno() == conn._sock.fileno() > 0
        internals.send_query("SELECT 41 + 1, 'x'")
        assert internals.read_rows() == [(42, "x")]
        with conn.cursor() as cursor:  # the connection is usable as PyMySQL's own afterwards
            cursor.execute("SELECT 7")
            assert cursor.fetchall() == ((7,),)
    finally:
        conn.close()


def test_pymysql_internals_raise_the_statements_error_as_pymysql_does(mysql_db):
    conn = mysql_db.detached()
    try:
        internals = PyMySQLInternals(conn)
        internals.send_query("SELECT * FROM bgq_no_such_table_anywhere")
        with pytest.raises(pymysql.err.ProgrammingError) as caught:
            internals.read_rows()
        assert caught.value.args[0] == 1146
    finally:
        conn.close()


# --- pika ---


def test_pika_still_has_the_adapter_timer():
    from pika.adapters.select_connection import SelectConnection

    for name in ("_adapter_call_later", "_adapter_remove_timeout"):
        assert callable(getattr(SelectConnection, name, None)), (
            f"pika {pika.__version__} has no {name}: see bgq/broker/rabbitmq.py _ioloop_timer"
        )


def test_the_ioloop_timer_fires_inside_a_blocking_wait_and_can_be_cancelled(rabbit):
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        fired: list[float] = []
        _ioloop_timer(connection, 0.05, lambda: fired.append(time.monotonic()))
        cancelled: list[float] = []
        cancel = _ioloop_timer(connection, 0.05, lambda: cancelled.append(time.monotonic()))
        cancel()
        connection.process_data_events(time_limit=0.3)
        assert len(fired) == 1
        assert cancelled == []
    finally:
        connection.close()
