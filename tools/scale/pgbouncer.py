"""PgBouncer 1.18 in transaction pooling in front of a PostgreSQL 15 cluster of the topology's own.

The server is a private cluster (tools/scale/pgnode.py) on 127.0.0.1:16433 with max_connections
300: the throughput pair runs 50 workers directly on it, then through PgBouncer, and 50 direct
`bgq work` processes need more than the 100 connections of the machine's server on 5432 (an
idle one holds 4: its LISTEN connection and 3 pooled ones). bgq's workers and publisher connect through
PgBouncer (127.0.0.1:16432) in bgq's pooled mode (`pooled=True`: no session state, no prepared
statements, docs/scale-out/pgbouncer.md), 10 server connections for every client; the LISTEN of
idle workers goes straight to the server (BGQ_CHAOS_LISTEN_URL). Faults:
  pooler_restart   SIGKILL PgBouncer and start it again on the same port: every client connection
                   and every server connection is cut at once, in or out of a transaction.
  pooler_kill_db   the admin console's KILL of the run's database, then RESUME: every client and
                   server connection of that database is dropped, PgBouncer itself stays up.
PgBouncer refuses to run as root: started as root it is given `-u postgres` (it drops to that
user itself, so the pid stays the one started, stopped by pid).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import ClassVar

from tools.scale.pgnode import Node, prepare
from tools.scale.topology import FaultSink, Topology, alive, port_open, stop_pids, wait_until

#: The machine's PostgreSQL (never restarted or reconfigured here): the default server of a
#: PgBouncer (the tests'); the topology fronts its own cluster on SERVER_PORT_OWN.
SERVER_HOST, SERVER_PORT = "127.0.0.1", 5432
SERVER_PORT_OWN = 16433
#: The user bgq connects as (PostgreSQL trusts loopback; PgBouncer trusts its auth_file's users).
USER = "postgres"
PORT = 16432


def config_text(
    workdir: Path,
    port: int,
    pool_size: int = 10,
    idle_transaction_timeout: int = 10,
    server_port: int = SERVER_PORT,
) -> str:
    """pgbouncer.ini for a transaction-pooling PgBouncer on 127.0.0.1:`port` in front of every
    database of the PostgreSQL on `server_port` (default: the machine's)."""
    return f"""\
[databases]
* = host={SERVER_HOST} port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {workdir / "userlist.txt"}
admin_users = {USER}
pool_mode = transaction
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 1000
max_db_connections = {pool_size}
; a client idle inside a transaction this long is cut, and its server connection with it: the
; pooled sessions' stand-in for idle_in_transaction_session_timeout (a session setting)
idle_transaction_timeout = {idle_transaction_timeout}
; a client waiting for a server connection this long gets an error instead of waiting for ever
query_wait_timeout = 30
server_connect_timeout = 5
server_login_retry = 1
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = {workdir / "pgbouncer.log"}
pidfile = {workdir / "pgbouncer.pid"}
log_connections = 0
log_disconnections = 0
"""


class PgBouncer:
    """One PgBouncer process on loopback: config in `workdir`, started, killed, restarted by pid."""

    def __init__(
        self,
        workdir: Path,
        port: int = PORT,
        pool_size: int = 10,
        idle_transaction_timeout: int = 10,
        server_port: int = SERVER_PORT,
    ):
        self.workdir, self.port = workdir, port
        self.pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "userlist.txt").write_text(f'"{USER}" ""\n')
        self.config = workdir / "pgbouncer.ini"
        self.config.write_text(config_text(workdir, port, pool_size, idle_transaction_timeout, server_port))
        if os.geteuid() == 0:  # the files must be PgBouncer's once it dropped to USER
            for path in (workdir, workdir / "userlist.txt", self.config):
                os.chown(path, _uid(USER), -1)
            for parent in workdir.parents:  # and it must reach them (mkdtemp makes 0700 dirs)
                mode = parent.stat().st_mode
                if mode & 0o011 != 0o011:
                    os.chmod(parent, mode | 0o011)

    def start(self, seconds: float = 20.0) -> int:
        """Start PgBouncer and wait until it accepts connections; its pid."""
        if port_open(self.port):
            raise RuntimeError(f"scale: port {self.port} is taken: another PgBouncer of ours left running?")
        argv = ["pgbouncer", str(self.config)]
        if os.geteuid() == 0:
            argv[1:1] = ["-u", USER]
        log = open(self.workdir / "pgbouncer.stderr", "ab")  # noqa: SIM115 (the child keeps it)
        self._proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        self.pid = self._proc.pid
        proc = self._proc
        wait_until(
            f"PgBouncer on {self.port}", lambda: proc.poll() is None and port_open(self.port), seconds, 0.05
        )
        return self.pid

    def kill(self) -> None:
        """SIGKILL: every connection through it is cut at once."""
        if self.pid is not None and alive(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
        self.pid = None

    def stop(self) -> None:
        if self.pid is not None:
            stop_pids([self.pid], grace=10.0)
            if self._proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=5)
        self.pid = None

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{database}"

    def admin(self, command: str) -> list[tuple[object, ...]]:
        """Run one command on the admin console (database `pgbouncer`; simple protocol only)."""
        import psycopg

        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=USER,
            dbname="pgbouncer",
            autocommit=True,
            connect_timeout=5,
        ) as conn:
            cur = conn.cursor()
            cur.execute(command, prepare=False)  # type: ignore[call-overload]
            return cur.fetchall() if cur.description else []

    def version(self) -> str:
        out = subprocess.run(["pgbouncer", "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.splitlines()[0].strip() if out.stdout else "PgBouncer"


def _uid(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_uid


class PgBouncerTopology(Topology):
    name = "pgbouncer"
    title = "PgBouncer 1.18, pool_mode = transaction, default_pool_size = 10, in front of PostgreSQL 15"
    dialect = "postgres"
    modes = ("work", "cron", "broker")
    fault_kinds = ("pooler_restart", "pooler_kill_db")
    packages = ("pgbouncer",)
    #: PgBouncer cuts connections; it never undoes a commit: any re-run is unexplained.
    may_rerun = False
    recovery_bound_s: ClassVar[float | None] = 10.0
    #: The issue's figure: 50 `bgq work` processes through a pool of 10 server connections.
    throughput_workers = 50
    full_chaos_workers: ClassVar[dict[str, int]] = {"work": 50}  # and the chaos faults beside them
    throughput_floor: ClassVar[float | None] = 0.8

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.server = Node(workdir, "server", SERVER_PORT_OWN)
        self.bouncer = PgBouncer(workdir / "pgbouncer", PORT, server_port=SERVER_PORT_OWN)
        self.database: str | None = None  # the run's database (pooler_kill_db), learnt from worker_url

    def start(self) -> None:
        prepare(self.workdir)
        self.server.initdb()
        self.server.configure("max_connections = 300\nshared_buffers = 128MB\n")
        self.pids.append(self.server.start())
        self.pids.append(self.bouncer.start())

    def stop(self) -> None:
        self.bouncer.stop()
        with contextlib.suppress(Exception):
            self.server.stop("fast")
        stop_pids(self.pids)
        self.pids.clear()

    def admin_url(self) -> str:
        return self.server.url("postgres")

    def direct_admin_url(self) -> str:
        return self.server.url("postgres")

    def worker_url(self, database: str) -> str:
        self.database = database
        return self.bouncer.url(database)

    def app_env(self, database: str) -> dict[str, str]:
        return {"BGQ_CHAOS_LISTEN_URL": self.server.url(database), "BGQ_CHAOS_POOLED": "1"}

    def fault(self, kind: str, faults: FaultSink) -> str:
        if kind == "pooler_restart":
            old = self.bouncer.pid
            faults.add(kind, old, "SIGKILL pgbouncer")
            self.bouncer.kill()
            pid = self.bouncer.start()
            self.pids.append(pid)
            faults.add(kind + "_done", pid, "pgbouncer started again")
            return f"pgbouncer {old} killed (SIGKILL), {pid} serving again"
        if kind == "pooler_kill_db":
            database = self.database or "postgres"
            faults.add(kind, self.bouncer.pid, f"KILL {database}")
            self.bouncer.admin(f"KILL {database}")
            time.sleep(0.5)
            self.bouncer.admin(f"RESUME {database}")
            faults.add(kind + "_done", self.bouncer.pid, f"RESUME {database}")
            return f"pgbouncer KILL {database} (every connection of it dropped), RESUME after 0.5 s"
        return super().fault(kind, faults)

    def heal(self) -> None:
        if self.bouncer.pid is None or not alive(self.bouncer.pid):
            self.pids.append(self.bouncer.start())

    def versions(self) -> list[str]:
        import psycopg

        with psycopg.connect(host=SERVER_HOST, port=SERVER_PORT_OWN, user=USER, dbname="postgres") as conn:
            row = conn.execute("SHOW server_version").fetchone()
        server = str(row[0]).split()[0] if row else "?"
        return [self.bouncer.version(), f"PostgreSQL {server}"]
