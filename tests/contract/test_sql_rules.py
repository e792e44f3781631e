"""Each shared SQL rule is spelled once per dialect, in db/<dialect>/macros/rules.sql.

A routine that wrote a rule out by hand (the unstarted and the claimable states, the queue
filter, the postponement, the pause check, the claim's write, a result's write, "no job of the group is
PROCESSING", the group's head, "the current attempt was cancelled") could drift from the others;
these are the rules' own spellings, which only the macros may contain. The schema's index
predicates and generated columns use the same macros (PostgreSQL's planner matches a partial
index's predicate word for word), and so does every module of bgq/ that holds SQL: the state
lists are not spelled out there either (sql/reads.py names them by its PENDING tuple).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import bgq
from bgq.sql.install import sql_dir

#: What only macros/rules.sql may spell out, per rule.
RULES = {
    "unstarted": re.compile(re.escape("IN (-1, 1, 4, 6, 8)")),
    "claimable": re.compile(re.escape("IN (1, 4, 6, 8)")),
    "claimable_not_waiting": re.compile(re.escape("IN (1, 4, 8)")),
    "in_queue": re.compile(re.escape("LENGTH(p_queue) + 1)")),
    "postponement_over": re.compile(re.escape("CEIL(COALESCE(")),
    "not_paused": re.compile(re.escape("pz.kind = 'group'")),
    "claim_write": re.compile(re.escape("number_of_attempts + 1")),
    # A result's write (finish_results, and hand_off's fast ways: the same writer).
    "result_write": re.compile(r"\bexecution_time = "),
    "abort_requested": re.compile(r"abort_requested_at >= "),
    "no_job_running": re.compile(
        r"NOT EXISTS \(\s*SELECT 1 FROM \{\{ table \}\}(?: AS (\w+))?\s+WHERE (?:\w+\.)?"
        r"(?:running_group = [\w.\[\]]+\s*\)|serial_group = [\w.\[\]]+ AND (?:\w+\.)?state = 2\s*\))"
    ),
    # PostgreSQL's shape (serial_group and the states), then MySQL's (its pending_group column).
    "group_head_id": re.compile(
        r"\(\s*SELECT (\w+)\.id FROM \{\{ table \}\} AS \1\s+WHERE \1\."
        r"(?:serial_group = [\w.\[\]]+ AND \1\.state IN \([-\d, ]+\)|pending_group = [^\n]+)"
        r"\s+ORDER BY \1\.priority, \1\.id\s+LIMIT 1\s*\)"
    ),
}

#: The rules a Python module holding SQL (sql/reads.py, sql/calls.py, the console) may not spell out.
PYTHON_RULES = ("unstarted", "claimable", "claimable_not_waiting")


def spelled_out(folder: Path) -> list[tuple[str, str]]:
    """(file, rule) for each routine file of `folder` that spells a shared rule out in its code
    (a header's contract may name the rule in words)."""
    return [
        (path.name, rule)
        for path in sorted(folder.glob("*.sql"))
        for rule, pattern in RULES.items()
        if pattern.search(re.sub(r"--[^\n]*", "", path.read_text()))
    ]


@pytest.mark.parametrize("dialect", ["mysql", "postgres"])
def test_every_routine_uses_the_shared_rules_instead_of_spelling_them_out(dialect):
    assert spelled_out(sql_dir(dialect)) == []


def test_no_python_module_spells_the_state_lists_out():
    package = Path(bgq.__file__).parent
    found = [
        (str(path.relative_to(package)), rule)
        for path in sorted(package.rglob("*.py"))
        for rule in PYTHON_RULES
        if RULES[rule].search(path.read_text())
    ]
    assert found == []


@pytest.mark.parametrize("dialect", ["mysql", "postgres"])
def test_the_rules_file_itself_holds_each_rule(dialect):
    """The patterns above find what they look for: each rule's macro in rules.sql matches its own."""
    rules = (sql_dir(dialect) / "macros" / "rules.sql").read_text()
    names = set(re.findall(r"\{% macro (\w+)\(", rules))
    literal = {
        "unstarted", "claimable", "claimable_not_waiting", "in_queue", "postponement_over",
        "not_paused", "claim_write", "abort_requested", "result_write",
    }  # fmt: skip
    assert literal <= names
    for rule in literal:
        assert RULES[rule].search(rules), rule


def test_a_routine_that_spells_a_rule_out_is_found(tmp_path):
    """The check fails where it should: a hand-written head dive of either dialect's shape, "no
    PROCESSING job" probe, abort test and claimable states, in a routine or in the schema; a
    header that names a rule in words is not code."""
    (tmp_path / "claim_something.sql").write_text(
        "SELECT 1 WHERE s.id = (\n"
        "    SELECT x.id FROM {{ table }} AS x\n"
        "    WHERE x.serial_group = s.serial_group AND x.state IN (-1, 1, 4, 6, 8)\n"
        "    ORDER BY x.priority, x.id\n"
        "    LIMIT 1\n"
        ") AND NOT EXISTS (\n"
        "    SELECT 1 FROM {{ table }} AS r\n"
        "    WHERE r.serial_group = s.serial_group AND r.state = 2\n"
        ") AND s.abort_requested_at >= s.last_attempt_at;\n"
    )
    (tmp_path / "claim_mysql.sql").write_text(
        "SELECT h.id FROM {{ table }} AS h WHERE h.id = (\n"
        "    SELECT x.id FROM {{ table }} AS x\n"
        "    WHERE x.pending_group = v_group\n"
        "    ORDER BY x.priority, x.id\n"
        "    LIMIT 1\n"
        ") AND h.state IN (1, 4, 8);\n"
    )
    (tmp_path / "contract_only.sql").write_text(
        "-- Cancelled: abort_requested_at >= last_attempt_at.\nSELECT 1;\n"
    )
    (tmp_path / "schema.sql").write_text("CREATE INDEX i ON t (p) WHERE state IN (1, 4, 6, 8);\n")
    assert spelled_out(tmp_path) == [
        ("claim_mysql.sql", "claimable_not_waiting"),
        ("claim_mysql.sql", "group_head_id"),
        ("claim_something.sql", "unstarted"),
        ("claim_something.sql", "abort_requested"),
        ("claim_something.sql", "no_job_running"),
        ("claim_something.sql", "group_head_id"),
        ("schema.sql", "claimable"),
    ]
