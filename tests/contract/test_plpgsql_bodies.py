"""Every PL/pgSQL body in db/postgres/ parses, with the statements inside it, without a server.

sqlfluff lints the statements around a function's $$-quoted body but not the body itself, so
this test hands each rendered CREATE FUNCTION to PostgreSQL's own parser (libpg_query, through
pglast): its PL/pgSQL grammar and every SQL statement inside it. The migrations and schema.sql
are plain SQL, which sqlfluff parses already.
"""

from __future__ import annotations

import json
import re

import pytest
from pglast import parser

from bgq.sql.install import SqlFiles, render

FILES = SqlFiles.load("postgres")
TABLE = "background_job"


def _create(name: str, text: str | None = None) -> str:
    rendered = render(FILES.routines[name] if text is None else text, TABLE, "postgres")
    return rendered[rendered.index("CREATE") :]


def _statements(tree: object) -> list[str]:
    """Every PL/pgSQL statement kind in the parsed function, in order of appearance."""
    return re.findall(r'"(PLpgSQL_stmt_\w+)"', json.dumps(tree))


@pytest.mark.parametrize("name", sorted(FILES.routines))
def test_the_body_and_every_statement_in_it_parse(name: str) -> None:
    (function,) = json.loads(parser.parse_plpgsql_json(_create(name)))
    kinds = _statements(function)
    assert kinds[0] == "PLpgSQL_stmt_block" and len(kinds) > 1, kinds  # a body with statements
    assert function["PLpgSQL_function"]["datums"], "the parameters and variables are declared"


@pytest.mark.parametrize(
    ("broken", "where"),
    [("SELECT", "an embedded statement"), ("END IF;", "the PL/pgSQL grammar"), ("THEN", "a condition")],
)
def test_a_broken_body_is_refused(broken: str, where: str) -> None:
    """The check would catch a typo in a body (each name appears in claim_batch's body)."""
    text = FILES.routines["claim_batch"]
    body = text.index("$$")
    assert broken in text[body:], where
    damaged = text[:body] + text[body:].replace(broken, broken[:-1] + "_", 1)
    with pytest.raises(parser.ParseError):
        parser.parse_plpgsql_json(_create("claim_batch", damaged))
