"""PostgreSQL keeps a worker's plans of hand_off and claim_heads for its whole session: they must
reach rows by key even when they were made on a new, empty install whose tables then grew.

A plan made while a table holds a few rows may read it whole (a sequential scan, a hashed
subplan over an index) and stays cached until an ANALYZE replans it: on a grown table that is a
read of every group row or every job per hand-off. MySQL has no such cache (a procedure's
statements are optimised at each run), so this is a PostgreSQL test.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.conftest import DATABASE_URLS, SERVICE_NAMES, Installed, _probe_database, require_service

GROUPS = 20_000
JOBS_PER_GROUP = 3
QUEUE = "general"


@pytest.fixture
def fresh() -> Any:
    require_service(SERVICE_NAMES["postgres"], _probe_database(DATABASE_URLS["postgres"]))
    target = Installed(DATABASE_URLS["postgres"])  # its own new table: empty, never analysed
    yield target
    target.drop()


def _insert(target: Installed, groups: range, per_group: int) -> None:
    target.sql(
        "INSERT INTO {t} (queue, priority, callback_name, state, serial_group, mode, created_at, updated_at)"
        f" SELECT '{QUEUE}', 2, 'noop', 1, 'g' || (MOD(i, {len(groups)}) + {groups.start}), 'normal',"
        " now() - INTERVAL '1 minute', now() - INTERVAL '1 minute'"
        f" FROM generate_series(0, {len(groups) * per_group - 1}) AS i"
    )


class Session:
    """One worker's database session: the functions called as bgq work calls them."""

    def __init__(self, target: Installed) -> None:
        self.table = target.table
        self.proxy = target.db.engine.raw_connection()
        self.pg = self.proxy.driver_connection
        self.pg.autocommit = True
        self.notices: list[str] = []
        self.pg.add_notice_handler(lambda d: self.notices.append(d.message_primary or ""))

    def _rows(self, sql: str, args: tuple[Any, ...]) -> list[dict[str, Any]]:
        with self.pg.transaction():
            cur = self.pg.execute(sql, args)
            names = [d.name for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def claim_batch(self, limit: int) -> list[dict[str, Any]]:
        return self._rows(
            f"SELECT * FROM {self.table}_claim_batch(%s, %s, 1, NULL, NULL, %s, 1000, NULL, NULL)",
            (QUEUE, limit, limit),
        )

    def hand_off(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        results = [
            {
                "id": j["id"],
                "attempt": j["attempt"],
                "state": 3,
                "error": None,
                "postponed_by": None,
                "execution_time": 0,
                "memory": None,
                "clone_delay_ms": None,
            }
            for j in jobs
        ]
        groups = sorted({j["serial_group"] for j in jobs})
        rows = self._rows(
            f"SELECT * FROM {self.table}_hand_off(%s, %s, %s, 1, NULL, NULL, 1000, NULL, NULL)",
            (json.dumps(results), json.dumps(groups), QUEUE),
        )
        finished = [r for r in rows if r["finished"] is not None]
        assert [r["finished"] for r in finished] == [1] * len(jobs), rows
        return [r for r in rows if r["finished"] is None]

    def close(self) -> None:
        self.proxy.close()


def test_plans_made_on_an_empty_install_reach_rows_by_key_once_the_tables_grew(fresh: Installed) -> None:
    session = Session(fresh)
    try:
        # While the tables hold a handful of rows: chains of two groups, handed off both ways
        # (one result: the short way; several: the batch way and claim_heads), several times.
        for round_ in range(4):
            _insert(fresh, range(100 * round_, 100 * round_ + 2), 2)
            claimed = session.claim_batch(10)
            assert len(claimed) == 2, claimed
            nexts = session.hand_off(claimed)  # batch way
            assert len(nexts) == 2, nexts
            for job in nexts:
                assert session.hand_off([job]) == []  # short way: the group has no job left

        # The tables grow under the same session's plans: 20,000 groups, each with its row.
        _insert(fresh, range(1000, 1000 + GROUPS), JOBS_PER_GROUP)
        fresh.sql(
            "INSERT INTO {t}_group (serial_group, updated_at)"
            " SELECT DISTINCT serial_group, now() FROM {t} ON CONFLICT (serial_group) DO NOTHING"
        )

        session.pg.execute("LOAD 'auto_explain'")
        for setting, value in (
            ("log_min_duration", "0"),
            ("log_nested_statements", "on"),
            ("log_analyze", "on"),
            ("log_level", "notice"),
        ):
            session.pg.execute(f"SET auto_explain.{setting} = {value}")
        session.pg.execute("SET client_min_messages = notice")
        claimed = session.claim_batch(100)
        assert len(claimed) == 100
        nexts = session.hand_off(claimed[:50])
        assert len(nexts) == 50
        assert len(session.hand_off(nexts[:1])) == 1
    finally:
        session.close()

    plans = "\n".join(session.notices)
    assert "v_locked := ARRAY(" in plans and "WITH heads AS" in plans  # claim_heads' plans were seen
    whole = re.findall(rf"Seq Scan on {fresh.table}(?:_group)? .*", plans)
    assert whole == [], whole
    assert "hashed SubPlan" not in plans
