"""Executor.persist: a result write keeps trying, never more than a second apart, for ~15 s."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from bgq.errors import ConnectionLostError
from bgq.jobs.executor import Executor
from bgq.sql import retry as retry_module
from bgq.sql.retry import PERSIST_PAUSES


class _FailingDatabase:
    """A database whose first `fails` transactions lose their connection."""

    def __init__(self, fails: int) -> None:
        self.fails = fails
        self.tries = 0

    @contextlib.contextmanager
    def transaction(self) -> Iterator[str]:
        self.tries += 1
        if self.tries <= self.fails:
            raise ConnectionLostError("server closed the connection unexpectedly")
        yield "conn"


def _executor(db: _FailingDatabase) -> Executor:
    ex = Executor.__new__(Executor)
    ex.store = SimpleNamespace(database=db)  # type: ignore[assignment]
    ex.log = logging.getLogger("bgq.test_persist")
    return ex


def test_a_result_write_lands_within_a_second_of_the_database_serving_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(retry_module.time, "sleep", slept.append)
    db = _FailingDatabase(fails=9)  # e.g. a cluster refusing commits for several seconds
    assert _executor(db).persist(lambda conn: f"written on {conn}", "bgq: Writing the result failed.") == (
        "written on conn"
    )
    assert db.tries == 10
    assert max(slept) <= 1.0  # once the database serves, the next try comes within a second
    assert sum(slept) >= 5.0  # and the nine failures were spread over seconds, not milliseconds


def test_a_result_write_gives_up_after_about_fifteen_seconds(
    monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(retry_module.time, "sleep", slept.append)
    db = _FailingDatabase(fails=1000)
    with caplog.at_level(logging.WARNING, logger="bgq.test_persist"):
        assert _executor(db).persist(lambda conn: conn, "bgq: Writing the result failed.") is None
    assert db.tries == len(PERSIST_PAUSES)
    assert 14.0 <= sum(slept) <= 16.0
    assert "Gave up after" in caplog.records[-1].getMessage()
