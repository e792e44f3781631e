"""Every procedure signature README.md documents is the one in bgq/sql/signatures.py and on the server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bgq.sql.calls import ALL_PROCS, INTERNAL_PROCS, Procs

README = Path(__file__).resolve().parent.parent / "README.md"
# A row of the "Calling the procedures from a SQL console" table: | `<table>_name(p_a, p_b)` ...
_ROW = re.compile(r"^\| `<table>_(\w+)\(([^)]*)\)`", re.MULTILINE)
_PUBLIC = {p.name: p for p in ALL_PROCS}
_EVERY = [p.name for p in (*ALL_PROCS, *INTERNAL_PROCS)]


def documented() -> dict[str, list[str]]:
    """{procedure: its documented parameter names}, from README.md."""
    out: dict[str, list[str]] = {}
    for name, params in _ROW.findall(README.read_text()):
        assert name not in out, f"{name} is documented twice"
        out[name] = [p.strip() for p in params.split(",") if p.strip()]
    return out


def test_the_readme_documents_every_installed_procedure_and_no_other():
    assert sorted(documented()) == sorted(_EVERY)


def test_documented_parameters_are_plain_names():
    """No '…' or types: each entry is the full list, so it can be compared."""
    for name, params in documented().items():
        assert all(re.fullmatch(r"p_\w+", p) for p in params), (name, params)


@pytest.mark.parametrize("name", sorted(_PUBLIC))
def test_readme_signature_matches_procs_py(name):
    assert documented()[name] == [p for p, _ in _PUBLIC[name].params]


def test_readme_signatures_match_the_installed_routines(installed):
    """The IN parameters, in order, as the server's catalogue lists them for each dialect."""
    with installed.db.transaction() as conn:
        routines = Procs(installed.db, installed.table).routines(conn)
    docs = documented()
    mismatches = {
        name: (docs[name], [list(r.inputs) for r in routines.get(name, [])])
        for name in _EVERY
        if [list(r.inputs) for r in routines.get(name, [])] != [docs[name]]
    }
    assert mismatches == {}
