"""The wheel carries db/<dialect>/*.sql and their migrations/, and an installed bgq finds them there."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from bgq.sql.install import SqlFiles

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_the_sql_and_finds_it(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("bgq-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for dialect in ("mysql", "postgres"):
        folder = ROOT / "db" / dialect
        expected = {p.relative_to(folder).as_posix() for p in folder.rglob("*.sql")}
        prefix = f"bgq/sql/{dialect}/"
        shipped = {n[len(prefix) :] for n in names if n.startswith(prefix) and n.endswith(".sql")}
        assert shipped == expected and {"claim.sql", "macros/rules.sql"} <= shipped
        assert any(n.startswith("migrations/0001_") for n in shipped)
    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    code = (
        "from bgq.sql.install import sql_dir, SqlFiles; print(sql_dir('postgres'));"
        " print(len(SqlFiles.load('mysql').migrations), SqlFiles.load('postgres').checksum)"
    )
    env = {**os.environ, "PYTHONPATH": str(unpacked)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=tmp_path
    )
    found, counts = out.stdout.strip().splitlines()
    assert found == str(unpacked / "bgq" / "sql" / "postgres")
    # The installed package loads the same migrations, and the same checksum, as the source tree.
    source = f"{len(SqlFiles.load('mysql').migrations)} {SqlFiles.load('postgres').checksum}"
    assert counts == source
