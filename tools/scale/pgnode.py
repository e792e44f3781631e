"""A private PostgreSQL 15 cluster of a topology: its data directory, port and postmaster, by pid.

Used by the standby topologies (a primary and its standby) and by PgBouncer (the server it pools,
sized for 50 direct workers, which the machine's own server with max_connections 100 is not).
Each cluster lives in the topology's workdir, listens on 127.0.0.1 and a socket in the workdir,
and never touches the machine's cluster on 5432. Run as the `postgres` user (runuser when root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tools.scale.topology import alive, port_open, stop_pids

BIN = Path("/usr/lib/postgresql/15/bin")
USER = "postgres"
HOST = "127.0.0.1"


def as_postgres(*argv: object, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [str(a) for a in argv]
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", USER, "--", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if check and out.returncode != 0:
        raise RuntimeError(f"scale: {' '.join(cmd)} failed: {(out.stderr or out.stdout).strip()}")
    return out


def chown(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, USER, USER)


def prepare(workdir: Path) -> None:
    """Make `workdir` usable by the postgres user: reachable, with its sockets and logs folders."""
    if not (BIN / "initdb").exists():
        raise RuntimeError(f"scale: {BIN}/initdb is missing (apt-get install postgresql-15)")
    workdir.chmod(0o755)  # mkdtemp makes it 0700: the postgres user reaches its folders through it
    for own in ("sockets", "logs"):
        (workdir / own).mkdir(exist_ok=True)
        chown(workdir / own)


class Node:
    """One cluster: data directory `workdir/name`, `port`, postmaster pid."""

    def __init__(self, workdir: Path, name: str, port: int) -> None:
        self.name, self.port = name, port
        self.data = workdir / name
        self.log = workdir / "logs" / f"{name}.log"  # (a directory the postgres user owns)
        self.sockets = workdir / "sockets"
        self.pid: int | None = None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{USER}@{HOST}:{self.port}/{database}"

    def initdb(self) -> None:
        """A new, empty cluster (trust auth, UTF8) in this node's data directory."""
        self.data.mkdir()
        chown(self.data)
        as_postgres(BIN / "initdb", "-D", self.data, "-U", USER, "--auth=trust", "--no-sync", "-E", "UTF8")

    def configure(self, settings: str) -> None:
        """Append this node's own settings to its postgresql.conf (the last of a name wins; a base
        backup copies the primary's file, so every node writes its own after): where it listens,
        then `settings` (postgresql.conf lines)."""
        with (self.data / "postgresql.conf").open("a") as f:
            f.write(
                f"\n# --- tools/scale, node {self.name} ---\n"
                f"port = {self.port}\nlisten_addresses = '{HOST}'\n"
                f"unix_socket_directories = '{self.sockets}'\ncluster_name = '{self.name}'\n"
                "log_line_prefix = '%m [%p] %a '\n"
                f"{settings}"
            )

    def start(self) -> int:
        if port_open(self.port):
            raise RuntimeError(f"scale: port {self.port} is taken: a cluster of ours left running?")
        as_postgres(BIN / "pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60", "start", timeout=90)
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        return self.pid

    def stop(self, mode: str = "fast") -> None:
        if self.pid is not None and alive(self.pid):
            as_postgres(
                BIN / "pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "30", "stop", check=False, timeout=60
            )
            if alive(self.pid):
                stop_pids([self.pid], grace=5.0)
        self.pid = None

    @property
    def up(self) -> bool:
        return self.pid is not None and alive(self.pid)

    def sql(self, statement: str) -> list[tuple[object, ...]]:
        import psycopg

        with psycopg.connect(
            host=HOST, port=self.port, user=USER, dbname="postgres", autocommit=True, connect_timeout=3
        ) as conn:
            cur = conn.execute(statement)  # type: ignore[call-overload]
            return cur.fetchall() if cur.description else []

    def writable(self) -> bool:
        rows = self.sql("SELECT pg_is_in_recovery(), current_setting('transaction_read_only')")
        if rows[0] != (False, "off"):
            return False
        self.sql("CREATE TEMPORARY TABLE bgq_scale_probe (a int)")  # a write that commits
        return True
