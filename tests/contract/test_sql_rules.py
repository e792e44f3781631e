"""Each shared SQL rule is spelled once per dialect, in db/<dialect>/macros/rules.sql.

A routine that wrote a rule out by hand (the unstarted states, the queue filter, the
postponement, the pause check, the claim's write, "no job of the group is PROCESSING", the
group's head, "the current attempt was cancelled") could drift from the others; these are the
rules' own spellings, which only the macros may contain. The schema's index predicates repeat
the states on purpose (the planner matches them word for word) and are not routines.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bgq.install import sql_dir

#: What only macros/rules.sql may spell out, per rule.
RULES = {
    "unstarted": re.compile(re.escape("IN (-1, 1, 4, 6, 8)")),
    "in_queue": re.compile(re.escape("LENGTH(p_queue) + 1)")),
    "postponement_over": re.compile(re.escape("CEIL(COALESCE(")),
    "not_paused": re.compile(re.escape("pz.kind = 'group'")),
    "claim_write": re.compile(re.escape("number_of_attempts + 1")),
    "abort_requested": re.compile(r"abort_requested_at >= "),
    "no_job_running": re.compile(
        r"NOT EXISTS \(\s*SELECT 1 FROM \{\{ table \}\}(?: AS (\w+))?\s+WHERE (?:\w+\.)?"
        r"(?:running_group = [\w.\[\]]+\s*\)|serial_group = [\w.\[\]]+ AND (?:\w+\.)?state = 2\s*\))"
    ),
    "group_head_id": re.compile(
        r"\(\s*SELECT (\w+)\.id FROM \{\{ table \}\} AS \1\s+WHERE \1\.serial_group = [\w.\[\]]+ "
        r"AND \1\.state IN \([-\d, ]+\)\s+ORDER BY \1\.priority, \1\.id\s+LIMIT 1\s*\)"
    ),
}


def spelled_out(folder: Path) -> list[tuple[str, str]]:
    """(file, rule) for each routine file of `folder` that spells a shared rule out in its code
    (a header's contract may name the rule in words)."""
    return [
        (path.name, rule)
        for path in sorted(folder.glob("*.sql"))
        if path.name != "schema.sql"
        for rule, pattern in RULES.items()
        if pattern.search(re.sub(r"--[^\n]*", "", path.read_text()))
    ]


@pytest.mark.parametrize("dialect", ["mysql", "postgres"])
def test_every_routine_uses_the_shared_rules_instead_of_spelling_them_out(dialect):
    assert spelled_out(sql_dir(dialect)) == []


@pytest.mark.parametrize("dialect", ["mysql", "postgres"])
def test_the_rules_file_itself_holds_each_rule(dialect):
    """The patterns above find what they look for: each rule's macro in rules.sql matches its own."""
    rules = (sql_dir(dialect) / "macros" / "rules.sql").read_text()
    names = set(re.findall(r"\{% macro (\w+)\(", rules))
    literal = {"unstarted", "in_queue", "postponement_over", "not_paused", "claim_write", "abort_requested"}
    assert literal <= names
    for rule in literal:
        assert RULES[rule].search(rules), rule


def test_a_routine_that_spells_a_rule_out_is_found(tmp_path):
    """The check fails where it should: a hand-written head dive, "no PROCESSING job" probe and
    abort test; a header that names a rule in words is not code."""
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
    (tmp_path / "contract_only.sql").write_text(
        "-- Cancelled: abort_requested_at >= last_attempt_at.\nSELECT 1;\n"
    )
    (tmp_path / "schema.sql").write_text("CREATE INDEX i ON t (g) WHERE state IN (-1, 1, 4, 6, 8);\n")
    assert spelled_out(tmp_path) == [
        ("claim_something.sql", "unstarted"),
        ("claim_something.sql", "abort_requested"),
        ("claim_something.sql", "no_job_running"),
        ("claim_something.sql", "group_head_id"),
    ]
