"""README.md's module map (the Layout section) lists exactly the modules under bgq/, each once.

A module added, moved or renamed without its line in the map fails here, and so does a map line
whose module is gone. A folder's `__init__.py` that holds only its docstring is the folder's own
line; any other `__init__.py` has a line of its own.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "bgq"

#: An entry of the map: four spaces, two more per folder below bgq/ (a few folders deep: deeper is a
#: description's next line, at column 25), then a folder or a module.
_ENTRY = re.compile(r"^    (?P<indent>(?:  ){0,4})(?P<name>[\w.]+(?:\.py|/))(?: |$)")


def map_lines() -> list[str]:
    """The indented block of README.md's Layout section."""
    section = (ROOT / "README.md").read_text().split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("    ")]


def map_entries(lines: list[str]) -> list[tuple[str, bool]]:
    """(path relative to bgq/, whether it has a line of its own) for each module the map lists
    under bgq/, in the map's order. A folder is an entry ending in "/"; a deeper entry belongs to
    the folder above it; a folder line stands for its __init__.py when that holds only a docstring."""
    entries: list[tuple[str, bool]] = []
    folders: list[str] = []  # the folders open at each depth below bgq/
    inside = False
    for line in lines:
        match = _ENTRY.match(line)
        if match is None:
            continue  # a description's next line
        depth, name = len(match["indent"]) // 2, match["name"]
        if depth == 0:
            inside = name == "bgq/"
            folders = []
            continue
        if not inside:
            continue
        folders = folders[: depth - 1]
        path = "".join(folders) + name
        if name.endswith("/"):
            folders.append(name)
            init = PACKAGE / path / "__init__.py"
            if init.exists() and only_a_docstring(init):
                entries.append((path + "__init__.py", False))
        else:
            entries.append((path, True))
    return entries


def only_a_docstring(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)


def package_modules() -> list[str]:
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))


def test_the_map_lists_every_module_under_bgq_exactly_once():
    listed = [path for path, _ in map_entries(map_lines())]
    assert sorted(set(listed)) == package_modules()
    assert sorted(listed) == sorted(set(listed)), [m for m in listed if listed.count(m) > 1]


def test_an_init_with_code_has_a_line_of_its_own():
    """The folder line is a docstring-only __init__.py's line; any other needs its own."""
    explicit = {path: own for path, own in map_entries(map_lines()) if path.endswith("__init__.py")}
    for init in PACKAGE.rglob("__init__.py"):
        path = init.relative_to(PACKAGE).as_posix()
        assert explicit[path] == (path == "__init__.py" or not only_a_docstring(init)), path


def test_every_module_says_what_it_does():
    """Each module opens with a docstring: its purpose."""
    missing = [
        path.relative_to(PACKAGE).as_posix()
        for path in sorted(PACKAGE.rglob("*.py"))
        if not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert missing == []


def test_a_module_without_a_line_is_found():
    """The parser sees what is missing: a module whose line is dropped is not listed."""
    lines = [line for line in map_lines() if not re.match(r"^        registry\.py ", line)]
    listed = [path for path, _ in map_entries(lines)]
    assert "modes/registry.py" in package_modules() and "modes/registry.py" not in listed
    assert "modes/work.py" in listed and "sql/calls.py" in listed and "db/__init__.py" in listed
