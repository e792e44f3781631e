"""The two dialects stay twins: file pairs, contract headers, signatures, result columns, states, SQL seam."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest

from bgq.db import mysql as mysql_dialect
from bgq.db import postgres as postgres_dialect
from bgq.model import ClaimResult, FinishResult, GroupHead, JobRef, JobState, Mode, Reaped
from bgq.sql.calls import Procs
from bgq.sql.signatures import ALL_PROCS, FINISH, INTERNAL_PROCS
from tests.support.helpers import PID, QUEUE, T0, at, claim, claimed, new_job, set_row

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
    return leading_comment(source(dialect, name))


def leading_comment(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
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
    return [(param, mode) for param, mode, _ in declared_signature(dialect, name)]


def declared_signature(dialect: str, name: str) -> list[tuple[str, str, str]]:
    """(name, IN/OUT, SQL type in upper case) of the CREATE statement's parameters."""
    text = code(dialect, name)
    match = re.search(
        rf"CREATE\s+(?:OR\s+REPLACE\s+)?(?:PROCEDURE|FUNCTION)\s+{re.escape(TABLE)}_{name}\s*\(", text
    )
    assert match, f"{dialect}/{name}.sql has no CREATE for {TABLE}_{name}"
    out = []
    for part in split_top(parenthesised(text, match.end() - 1)):
        words = part.split()
        if words[0].upper() in ("IN", "OUT", "INOUT"):
            out.append((words[1], words[0].upper(), words[2].upper()))
        else:
            out.append((words[0], "IN", words[1].upper()))
    return out


#: SQL types a parameter line may name in parentheses, as in 'p_now  the clock (DATETIME(6), UTC)'.
_TYPE_NAMES = (
    "DATETIME",
    "TIMESTAMPTZ",
    "TIMESTAMP",
    "BIGINT",
    "SMALLINT",
    "INTEGER",
    "VARCHAR",
    "TEXT",
    "JSON",
)
_PARAMETER_LINE = re.compile(r"^   (p_\w+(?:,\s*p_\w+)*)(?::|\s+|$)(.*)$")
_SAME_PARAMETERS = re.compile(rf"Parameters as in {re.escape(TABLE)}_(\w+)")


def contract_section(lines: list[str]) -> list[str]:
    """The header's lines from 'Contract' up to the next section ('Result:', 'Locks:', ...)."""
    start = next(i for i, line in enumerate(lines) if line.strip() == "Contract")
    out = []
    for line in lines[start + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) <= 1:
            break
        out.append(line)
    return out


def parameter_lines(lines: list[str]) -> list[tuple[str, str]]:
    """(parameter, its description) for every parameter line of the Contract section, in order.

    A parameter line is indented by 3 and starts with p_ names ('p_a, p_b: ...' documents both);
    the lines indented deeper below it continue its description.
    """
    out: list[tuple[str, str]] = []
    for line in contract_section(lines):
        match = _PARAMETER_LINE.match(line)
        if match:
            for param in re.split(r",\s*", match.group(1)):
                out.append((param, match.group(2).strip()))
        elif out and len(line) - len(line.lstrip()) > 3 and out[-1][1] is not None:
            out[-1] = (out[-1][0], f"{out[-1][1]} {line.strip()}")
    return out


def parameter_line_problems(
    lines: list[str], declared: list[tuple[str, str, str]], referenced: list[tuple[str, str]] | None = None
) -> list[str]:
    """Every way the header's parameter lines differ from the declared parameters (empty: none).

    `declared`: (name, IN/OUT, type) of the CREATE statement (or of the installed routine).
    `referenced`: the parameter lines of the procedure a line 'Parameters as in {{ table }}_x' names.
    The lines must name every IN parameter and every OUT parameter named p_*, in the declared
    order; an OUT one's line starts with 'OUT:'; a type a line names in parentheses is the
    declared one; OUT parameters named o_* are documented under 'Result:' instead.
    """
    documented = parameter_lines(lines)
    if _SAME_PARAMETERS.search(" ".join(line.strip() for line in contract_section(lines))):
        assert referenced is not None, "the header refers to another procedure's parameter lines"
        documented = documented + referenced
    expected = [(p, mode, kind) for p, mode, kind in declared if mode != "OUT" or p.startswith("p_")]
    problems = []
    names = [p for p, _ in documented]
    if names != [p for p, _, _ in expected]:
        problems.append(f"parameter lines {names} != declared parameters {[p for p, _, _ in expected]}")
    descriptions = dict(documented)
    for param, mode, kind in expected:
        text = descriptions.get(param)
        if text is None:
            continue
        if (mode == "OUT") != text.startswith("OUT:"):
            problems.append(f"{param} is {mode} but its line {'lacks' if mode == 'OUT' else 'has'} 'OUT:'")
        named = re.search(rf"\(({'|'.join(_TYPE_NAMES)})(?![A-Za-z_])(\(\d+\))?", text)
        if named and named.group(0)[1:] != kind:
            problems.append(f"{param}'s line names the type {named.group(0)[1:]}, declared {kind}")
    result = "\n".join(
        lines[next((i for i, line in enumerate(lines) if line.startswith(" Result:")), len(lines)) :]
    )
    for param, mode, _ in declared:
        if mode == "OUT" and not param.startswith("p_") and not re.search(rf"\b{param}\b", result):
            problems.append(f"OUT parameter {param} is not documented under 'Result:'")
    return problems


def documented_parameter_problems(dialect: str, name: str) -> list[str]:
    lines = header_lines(dialect, name)
    ref = _SAME_PARAMETERS.search(" ".join(line.strip() for line in contract_section(lines)))
    referenced = parameter_lines(header_lines(dialect, ref.group(1))) if ref else None
    return parameter_line_problems(lines, declared_signature(dialect, name), referenced)


def header_result_columns(dialect: str, name: str) -> list[str] | None:
    """Result column names from the header: 'Result: rows (a, b)' or the indented list under 'Result:'."""
    return result_columns_of(header_lines(dialect, name))


def result_columns_of(lines: list[str]) -> list[str] | None:
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

_FINISHED = json.dumps([{"id": 987654, "attempt": 1, "state": 3}])
#: Arguments of every public procedure, called on a real table that holds one READY job (`job`),
#: one claimed job (`running`, `attempt`) of a registered worker (`worker`, silent since T0), a
#: paused group and a schedule: each call returns at least one row where its contract allows it.
_RESULT_CALLS = {
    "back_to_broker": lambda c: (QUEUE, 10, T0),
    "broker_failed": lambda c: (c.job, "headers", T0),
    "claim": lambda c: (c.job, QUEUE, PID, 1000, None, None, T0),
    "claim_batch": lambda c: (QUEUE, 10, PID, None, None, None, 1000, None, T0),
    "claim_ids": lambda c: (json.dumps([c.job]), QUEUE, PID, 1000, None, T0),
    "clear_finished": lambda c: (QUEUE, None, T0),
    "due_jobs": lambda c: (QUEUE, 0, 10, T0),
    "finish": lambda c: (c.running, c.attempt, 3, None, None, None, None, None, T0),
    "finish_batch": lambda c: (_FINISHED, T0),
    "group_heads": lambda c: (),
    "hand_off": lambda c: (_FINISHED, '["hg"]', QUEUE, PID, None, None, 1000, None, T0),
    "heartbeat": lambda c: (c.running, c.attempt, None, T0),
    "lost_messages": lambda c: (QUEUE, 0, 10, T0),
    "monitor": lambda c: (QUEUE, 0, T0),
    "promote_waiting": lambda c: (T0,),
    "reap": lambda c: (QUEUE, 0, 10, None, at(1)),
    "requeue": lambda c: (c.job, "headers", T0),
    "run_now": lambda c: (c.job, "headers", T0),
    "unfinished_identifiers": lambda c: (QUEUE, None, 0),
    "worker_register": lambda c: ("host-h", PID, "work", QUEUE, "0.0.0", T0),
    "worker_heartbeat": lambda c: (c.worker, c.running, 1, T0),
    "worker_deregister": lambda c: (c.worker,),
    "worker_reap": lambda c: (QUEUE, 30, 10, None, at(31)),
    "pause": lambda c: ("group", "hp", "headers", "tests", T0),
    "resume": lambda c: ("group", "hp"),
    "pauses": lambda c: (),
    "cancel": lambda c: (c.job, "headers", T0),
    "schedule_upsert": lambda c: ("hs2", "* * * * *", "UTC", "cb", None, QUEUE, None, 1, "once", at(60), T0),
    "schedule_retire": lambda c: (QUEUE, "[]", T0),
    "schedules": lambda c: (QUEUE, 0, T0),
    "fire": lambda c: ("hs", at(60), at(120), T0),
}
_ROW_PROCS = [p for p in ALL_PROCS if not p.function]


def test_every_row_returning_procedure_has_a_result_call():
    assert sorted(_RESULT_CALLS) == sorted(p.name for p in _ROW_PROCS)


@dataclasses.dataclass(frozen=True)
class _Setup:
    job: int
    running: int
    attempt: int
    worker: int


def returned_columns(installed, proc) -> tuple[list[str], int]:
    """The column names a real call of `proc` returns, in order, and how many rows it returned."""
    job = new_job(installed, identifier="h")
    running = new_job(installed)
    procs = Procs(installed.db, installed.table)
    with installed.db.transaction() as conn:
        worker = procs.worker_register(conn, "host-h", PID, "work", QUEUE, "0.0.0", T0)
        procs.pause(conn, "group", "hp", "headers", "tests", T0)
        procs.schedule_upsert(conn, "hs", "* * * * *", "UTC", "cb", None, QUEUE, None, 1, "once", at(60), T0)
    attempt = claimed(installed, running, worker_id=worker)
    if proc.name == "back_to_broker":
        set_row(installed, job, state=-1)
    if proc.name in ("group_heads", "promote_waiting"):  # a group with a WAITING head
        head, second = new_job(installed, group="hg"), new_job(installed, group="hg")
        claimed(installed, head)
        assert claim(installed, second).outcome == "waiting"
        if proc.name == "promote_waiting":
            set_row(installed, head, state=3)  # behind the group's back: nobody woke `second`
    with installed.db.transaction() as conn:
        args = _RESULT_CALLS[proc.name](_Setup(job, running, attempt, worker))
        result = conn.exec_driver_sql(installed.db.dialect.call_sql(installed.table, proc), args)
        columns = list(result.keys())
        rows = result.all()
    return columns, len(rows)


def result_column_problems(lines: list[str], returned: list[str]) -> list[str]:
    documented = result_columns_of(lines)
    return (
        [] if documented == returned else [f"the header documents {documented}, the call returns {returned}"]
    )


@pytest.mark.parametrize("proc", _ROW_PROCS, ids=lambda p: p.name)
def test_returned_columns_are_the_documented_ones(installed, proc):
    """The columns a real call returns, in order, on each dialect, are the header's Result list
    (of this dialect's header; both headers list the same columns, tested above)."""
    columns, rows = returned_columns(installed, proc)
    assert rows >= 1, f"{proc.name} returned no row: the call does not reach its result"
    assert result_column_problems(header_lines(installed.db.dialect.name, proc.name), columns) == []


@pytest.mark.parametrize("name", [p.name for p in INTERNAL_PROCS])
def test_internal_routines_return_only_their_documented_out_parameters(installed, name):
    """claim_job, claim_heads, finish_results, group_wake: no rows on MySQL (a nested CALL must send none);
    PostgreSQL's function returns its OUT parameters (or its scalar) as the row."""
    dialect, t = installed.db.dialect.name, installed.table
    running = new_job(installed, group="hg")
    outs = [p for p, mode, _ in declared_signature(dialect, name) if mode == "OUT"]
    ins = [p for p, mode, _ in declared_signature(dialect, name) if mode == "IN"]
    groups = ["hg"] if dialect == "postgres" else '["hg"]'  # VARCHAR[] there, JSON text here
    args = {
        "claim_job": (running, QUEUE, PID, 1000, None, None, T0),
        "claim_heads": (groups, None, QUEUE, PID, None, None, 1000, None, T0),
        "finish_results": (_FINISHED, T0),
        "group_wake": ("hg", T0),
    }[name]
    assert len(args) == len(ins)
    with installed.db.transaction() as conn:
        if dialect == "mysql":
            marks = ", ".join(["%s"] * len(ins) + [f"@{p}" for p in outs])
            result = conn.exec_driver_sql(f"CALL {t}_{name}({marks})", args)
            columns = list(result.keys()) if result.returns_rows else []
        else:
            casts = [kind for _, mode, kind in declared_signature(dialect, name) if mode == "IN"]
            marks = ", ".join(f"%s::{kind}" for kind in casts)
            select = f"SELECT * FROM {t}_{name}({marks})" if outs else f"SELECT {t}_{name}({marks}) AS result"
            result = conn.exec_driver_sql(select, args)
            columns = list(result.keys())
            assert len(result.all()) == 1
    expected = {"mysql": [], "postgres": outs or ["result"]}[dialect]
    assert columns == expected


# --- every parameter line ---


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("name", PROCEDURES)
def test_every_parameter_line_is_a_declared_parameter_in_order(dialect, name):
    """Each header documents every parameter of its CREATE statement on a line of its own, in
    the declared order, with the declared type where it names one (see parameter_line_problems)."""
    assert documented_parameter_problems(dialect, name) == []


def test_parameter_lines_name_the_installed_routines_inputs(installed):
    """The parameter lines against the server's catalogue (what is installed, not the file)."""
    dialect = installed.db.dialect.name
    with installed.db.transaction() as conn:
        found = Procs(installed.db, installed.table).routines(conn)
    assert sorted(found) == sorted(PROCEDURES)
    for name, (routine,) in sorted(found.items()):
        lines = header_lines(dialect, name)
        ref = _SAME_PARAMETERS.search(" ".join(line.strip() for line in contract_section(lines)))
        documented = parameter_lines(lines) + (
            parameter_lines(header_lines(dialect, ref.group(1))) if ref else []
        )
        outs = [p for p, mode, _ in declared_signature(dialect, name) if mode == "OUT"]
        inputs = [p for p, _ in documented if p not in outs]
        assert inputs == list(routine.inputs), name
        clock = dict(documented).get("p_now")
        if clock is not None:
            kind = {"mysql": "datetime(6)", "postgres": "timestamp with time zone"}[dialect]
            assert f"p_now {kind}" in routine.signature.lower(), (name, routine.signature)


def _edited(lines: list[str], old: str, new: str) -> list[str]:
    """A copy of a header with one line's text replaced (the line must exist)."""
    hits = [i for i, line in enumerate(lines) if old in line]
    assert len(hits) == 1, (old, hits)
    copy = list(lines)
    copy[hits[0]] = copy[hits[0]].replace(old, new)
    return copy


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("   p_pid ", "\0", "parameter lines"),  # a parameter line left out
        ("   p_limit ", "   p_limits ", "parameter lines"),  # a misspelt parameter
        ("   p_waiting_ms ", "   p_max_heads ", "parameter lines"),  # two lines for one, none for another
        (
            "(DATETIME(6), UTC)",
            "(DATETIME, UTC)",
            "p_now's line names the type DATETIME, declared DATETIME(6)",
        ),
        ("   p_worker_id ", "   p_worker_id OUT: ", "p_worker_id is IN but its line has 'OUT:'"),
    ],
)
def test_a_wrong_parameter_line_in_a_copy_of_a_header_is_caught(old, new, problem):
    lines = header_lines("mysql", "claim_batch")
    assert documented_parameter_problems("mysql", "claim_batch") == []
    if new == "\0":
        lines = [line for line in lines if not line.startswith(old)]
    else:
        lines = _edited(lines, old, new)
    problems = parameter_line_problems(lines, declared_signature("mysql", "claim_batch"))
    assert problems and problem in problems[0], problems


def test_a_missing_out_line_in_a_copy_of_a_header_is_caught():
    lines = header_lines("mysql", "group_wake")
    declared = declared_signature("mysql", "group_wake")
    assert parameter_line_problems(lines, declared) == []
    broken = _edited(lines, "p_promoted_id  OUT: the job", "p_promoted_id  the job")
    assert parameter_line_problems(broken, declared) == ["p_promoted_id is OUT but its line lacks 'OUT:'"]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("   clone_id ", "   clone    "),  # a renamed column
        ("   promoted_queue, promoted_priority:", "   promoted_priority, promoted_queue:"),  # order
        ("   promoted_id  ", "   promoted_id_x"),  # misspelt
    ],
)
def test_a_wrong_result_column_in_a_copy_of_a_header_is_caught(installed, old, new):
    columns, _ = returned_columns(installed, FINISH)
    lines = header_lines(installed.db.dialect.name, "finish")
    assert result_column_problems(lines, columns) == []
    assert result_column_problems(_edited(lines, old, new), columns) != []


# --- the SQL seam ---

#: The procedure calls (sql/calls.py), the publish INSERTs (sql/inserts.py), the installer
#: (sql/install.py), the database seam (db/) and the web console's SELECTs (sql/reads.py); no other
#: module names SQL.
_SQL_HOMES = {
    "sql/calls.py", "sql/inserts.py", "sql/install.py", "sql/reads.py",
    "db/__init__.py", "db/mysql.py", "db/postgres.py",
}  # fmt: skip
_SQL_WORDS = ("SELECT ", "INSERT INTO", "UPDATE ", "DELETE FROM", "CALL ")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def test_no_sql_outside_the_sql_and_db_layers():
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
