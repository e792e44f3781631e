"""The two dialects stay twins: file pairs, contract headers, signatures, result columns, states, SQL seam."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from bgq.db import mysql as mysql_dialect
from bgq.db import postgres as postgres_dialect
from bgq.model import ClaimResult, FinishResult, GroupHead, JobRef, JobState, Mode, Reaped
from bgq.procs import (
    ALL_PROCS,
    CLAIM,
    CLAIM_BATCH,
    DUE_JOBS,
    FINISH,
    FINISH_BATCH,
    GROUP_HEADS,
    HAND_OFF,
    PROMOTE_WAITING,
    REAP,
    REQUEUE,
)

from .helpers import T0, new_job

ROOT = Path(__file__).resolve().parents[2]
DB = ROOT / "db"
DIALECTS = ("mysql", "postgres")
TABLE = "{{ table }}"


def sql_names(dialect: str) -> set[str]:
    return {p.name for p in (DB / dialect).glob("*.sql")}


PROCEDURES = sorted({Path(n).stem for d in DIALECTS for n in sql_names(d)} - {"schema"})


def source(dialect: str, name: str) -> str:
    return (DB / dialect / f"{name}.sql").read_text()


def header_lines(dialect: str, name: str) -> list[str]:
    """The leading comment block, each line without its '--'."""
    out = []
    for line in source(dialect, name).splitlines():
        if not line.startswith("--"):
            break
        out.append(line[2:])
    return out


def header(dialect: str, name: str) -> str:
    return "\n".join(header_lines(dialect, name))


def code(dialect: str, name: str) -> str:
    """The file without comments."""
    return "\n".join(re.sub(r"--.*$", "", line) for line in source(dialect, name).splitlines())


def parenthesised(text: str, start: int) -> str:
    """The text inside the balanced parentheses that open at text[start]."""
    assert text[start] == "("
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i]
    raise AssertionError("unbalanced parentheses")


def split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def usage_parameters(dialect: str, name: str) -> list[str]:
    """Parameter names of the usage line under 'Contract' (an '@out' session variable is left out)."""
    text = header(dialect, name)
    contract = text.index("Contract")
    flat = re.sub(r"\n\s*", " ", text[contract:])
    start = flat.index(f"{TABLE}_{name}(") + len(f"{TABLE}_{name}")
    return [p for p in split_top(parenthesised(flat, start)) if not p.startswith("@")]


def declared_parameters(dialect: str, name: str) -> list[tuple[str, str]]:
    """(name, IN/OUT) of the CREATE statement's parameters."""
    text = code(dialect, name)
    match = re.search(
        rf"CREATE\s+(?:OR\s+REPLACE\s+)?(?:PROCEDURE|FUNCTION)\s+{re.escape(TABLE)}_{name}\s*\(", text
    )
    assert match, f"{dialect}/{name}.sql has no CREATE for {TABLE}_{name}"
    out = []
    for part in split_top(parenthesised(text, match.end() - 1)):
        words = part.split()
        if words[0].upper() in ("IN", "OUT", "INOUT"):
            out.append((words[1], words[0].upper()))
        else:
            out.append((words[0], "IN"))
    return out


def header_result_columns(dialect: str, name: str) -> list[str] | None:
    """Result column names from the header: 'Result: rows (a, b)' or the indented list under 'Result:'."""
    lines = header_lines(dialect, name)
    starts = [i for i, line in enumerate(lines) if line.strip().startswith("Result:")]
    if not starts:
        return None
    first = lines[starts[0]]
    inline = re.search(r"Result:[^(]*\(([^)]*)\)", first)
    if inline:
        return [c.strip() for c in inline.group(1).split(",")]
    columns: list[str] = []
    for line in lines[starts[0] + 1 :]:
        indent = len(line) - len(line.lstrip())
        if indent <= 1:  # the next section
            break
        if indent != 3:  # a description's continuation
            continue
        prefix = re.split(r"\s{2,}|:", line.strip())[0]
        columns += [c.strip() for c in prefix.split(",") if re.fullmatch(r"[a-z_]+", c.strip())]
    return columns


def returns_table_columns(name: str) -> list[str] | None:
    text = code("postgres", name)
    match = re.search(r"RETURNS\s+TABLE\s*\(", text)
    if not match:
        return None
    return [part.split()[0] for part in split_top(parenthesised(text, match.end() - 1))]


def check_list(dialect: str, column: str) -> list[str]:
    text = code(dialect, "schema")
    match = re.search(rf"{re.escape(TABLE)}_{column}_check\s+CHECK\s*\(\s*{column}\s+IN\s*\(([^)]*)\)", text)
    assert match, f"no CHECK on {column} in {dialect}/schema.sql"
    return [v.strip().strip("'") for v in match.group(1).split(",")]


# --- files and headers ---


def test_every_sql_file_has_a_twin():
    assert sql_names("mysql") == sql_names("postgres")


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("name", PROCEDURES)
def test_header_names_the_procedure_and_its_contract_parts(dialect, name):
    first = header_lines(dialect, name)[0]
    assert f"{TABLE}_{name}" in first
    text = header(dialect, name)
    missing = [
        word
        for word, pattern in (
            ("Contract", r"\bContract\b"),
            ("Locks", r"\bLocks?\b"),
            ("Fencing", r"\bFencing\b"),
            ("Errors", r"\bErrors\b"),
            ("Idempotent", r"\bIdempotent\b"),
        )
        if not re.search(pattern, text)
    ]
    assert missing == [], f"{dialect}/{name}.sql header lacks {missing}"


@pytest.mark.parametrize("name", PROCEDURES)
def test_both_headers_carry_the_same_version(name):
    versions = [re.search(r"version (\d+)", header_lines(d, name)[0]) for d in DIALECTS]
    assert all(versions)
    assert versions[0].group(1) == versions[1].group(1)


@pytest.mark.parametrize("name", PROCEDURES)
def test_usage_lines_name_the_same_parameters_as_the_create_statements(name):
    usages = {d: usage_parameters(d, name) for d in DIALECTS}
    declared = {d: [p for p, mode in declared_parameters(d, name) if mode == "IN"] for d in DIALECTS}
    assert usages["mysql"] == usages["postgres"]
    assert declared["mysql"] == declared["postgres"]
    assert usages["mysql"] == declared["mysql"]


@pytest.mark.parametrize("proc", ALL_PROCS, ids=lambda p: p.name)
def test_procs_py_signatures_match_the_sql_files(proc):
    assert [name for name, _ in proc.params] == usage_parameters("mysql", proc.name)


@pytest.mark.parametrize("name", PROCEDURES)
def test_both_headers_list_the_same_result_columns(name):
    mysql_columns = header_result_columns("mysql", name)
    assert mysql_columns == header_result_columns("postgres", name)
    returns = returns_table_columns(name)
    if returns is not None:
        assert mysql_columns == returns


@pytest.mark.parametrize("name", PROCEDURES)
def test_both_dialects_raise_the_same_documented_errors(name):
    states = {d: sorted(set(re.findall(r"SQLSTATE (BQ\d{3})", header(d, name)))) for d in DIALECTS}
    assert states["mysql"] == states["postgres"]
    signalled = sorted(set(re.findall(r"SIGNAL SQLSTATE '(BQ\d{3})'", code("mysql", name))))
    raised = sorted(set(re.findall(r"ERRCODE = '(BQ\d{3})'", code("postgres", name))))
    assert signalled == raised == states["mysql"]
    documented = dict(re.findall(r"(\d{5}) / SQLSTATE (BQ\d{3})", header("mysql", name)))
    assert sorted(documented.values()) == states["mysql"]
    errnos = {int(n) for n in re.findall(r"MYSQL_ERRNO = (\d+)", code("mysql", name))}
    assert errnos == {int(n) for n in documented}
    for errno, sqlstate in documented.items():
        assert mysql_dialect._BGQ_ERRORS[int(errno)] is postgres_dialect._BGQ_ERRORS[sqlstate]


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("name", PROCEDURES)
def test_procedures_never_commit(dialect, name):
    assert not re.search(r"\b(COMMIT|ROLLBACK)\b", code(dialect, name), re.IGNORECASE)


# --- Python mirrors the database ---


@pytest.mark.parametrize("dialect", DIALECTS)
def test_job_states_match_the_state_check(dialect):
    assert sorted(int(v) for v in check_list(dialect, "state")) == sorted(int(s) for s in JobState)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_modes_match_the_mode_check(dialect):
    assert sorted(check_list(dialect, "mode")) == sorted(m.value for m in Mode)


def _field_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


@pytest.mark.parametrize(
    ("name", "cls"),
    [("claim", ClaimResult), ("finish", FinishResult), ("group_heads", GroupHead), ("reap", Reaped)],
)
def test_result_dataclasses_match_the_result_columns(name, cls):
    assert _field_names(cls) == header_result_columns("mysql", name)


def test_job_ref_matches_the_due_jobs_columns():
    assert _field_names(JobRef) == header_result_columns("mysql", "due_jobs")


# --- what each dialect actually returns ---

_RESULT_CALLS = {
    "claim": (CLAIM, lambda job: (987654, "general", 1, 1000, None, None, T0)),
    "finish": (FINISH, lambda job: (987654, 1, 3, None, None, None, None, None, T0)),
    "claim_batch": (CLAIM_BATCH, lambda job: ("general", 10, 1, None, None, 1, 1000, 5, T0)),
    "finish_batch": (FINISH_BATCH, lambda job: ('[{"id": 987654, "attempt": 1, "state": 3}]', T0)),
    "hand_off": (
        HAND_OFF,
        lambda job: (
            '[{"id": 987654, "attempt": 1, "state": 3}]',
            "g",
            "general",
            1,
            None,
            None,
            1000,
            5,
            T0,
        ),
    ),
    "group_heads": (GROUP_HEADS, lambda job: ()),
    "promote_waiting": (PROMOTE_WAITING, lambda job: (T0,)),
    "due_jobs": (DUE_JOBS, lambda job: ("general", 0, 10, T0)),
    "requeue": (REQUEUE, lambda job: (job, "headers", T0)),
    "reap": (REAP, lambda job: ("general", 60, 10, None, T0)),
}


@pytest.mark.parametrize("name", sorted(_RESULT_CALLS))
def test_returned_columns_are_the_documented_ones(installed, name):
    """The same column names, in the same order, on both dialects (the header is the shared list)."""
    proc, args = _RESULT_CALLS[name]
    job = new_job(installed)
    with installed.db.transaction() as conn:
        result = conn.exec_driver_sql(installed.db.dialect.call_sql(installed.table, proc), args(job))
        columns = list(result.keys())
        result.all()
    assert columns == header_result_columns("mysql", name)


# --- the SQL seam ---

#: The procedure calls (procs.py), the installer (install.py) and the database seam; no other
#: module names SQL.
_SQL_HOMES = {"procs.py", "install.py", "db/__init__.py", "db/mysql.py", "db/postgres.py"}
_SQL_WORDS = ("SELECT ", "INSERT INTO", "UPDATE ", "DELETE FROM", "CALL ")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def test_no_sql_outside_procs_and_db():
    package = ROOT / "bgq"
    offenders = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative in _SQL_HOMES:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                words = [w for w in _SQL_WORDS if w in node.value]
                if words:
                    offenders.append(f"bgq/{relative}:{node.lineno} {words}")
    assert offenders == []
