"""A PostgreSQL 15 primary and a streaming standby of its own, and a failover between them.

Two clusters in the topology's workdir, each a postmaster of the `postgres` user on loopback:
node "a" on 127.0.0.1:25432 and node "b" on 127.0.0.1:25433 (unix sockets in the workdir, never
the machine's cluster on 5432). The first primary is `a` (wal_level=replica); the standby is
made from it with `pg_basebackup -R` (streaming, hot_standby). bgq connects with a multi-host URL,
`?host=127.0.0.1:25432&host=127.0.0.1:25433&target_session_attrs=read-write`: libpq tries the
hosts in order and keeps the one that takes writes, whichever that is now.

Two topologies:
  standby        synchronous replication: the primary's synchronous_standby_names names the
                 standby, synchronous_commit=on: a commit returns once the standby has flushed
                 it, so a failover loses no acknowledged commit.
  standby-async  asynchronous replication (synchronous_standby_names=''): a commit returns once
                 the primary has flushed it; what had not reached the standby when the primary
                 died is lost at the failover (docs/scale-out/standby.md), so the oracle
                 classifies the re-runs a failover explains (`may_rerun`).

The fault "failover": `pg_ctl stop -m immediate` of the primary (faults "failover"), a
detection delay (DETECT_S, what a failover manager's health checks take), `pg_ctl promote -w`
of the standby, then a write on it (faults "failover_done": the new primary accepts writes).
The standby's synchronous_standby_names is always '' in its own postgresql.conf, whatever
pg_basebackup copied from the primary: promoted, it must not wait for a standby that is gone (it
would make every commit hang). Right after the promotion the fault rebuilds the node that went
down as the new primary's standby (heal(): a fresh pg_basebackup, so the old primary's
unreplicated tail is discarded, no pg_rewind), and only once it streams names it in the new
primary's synchronous_standby_names (reload): the next failover of a run has a standby to go to.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import ClassVar

from tools.scale.pgnode import BIN, HOST, USER, Node, as_postgres, chown, prepare
from tools.scale.topology import FaultSink, Topology, wait_until

PORTS = {"a": 25432, "b": 25433}
#: Seconds between the primary's death and the promotion: a failover manager's detection.
DETECT_S = 1.0


def replication_settings(synchronous_standby_names: str, synchronous: bool) -> str:
    """A node's postgresql.conf lines: streaming replication, synchronous or not."""
    sync = "on" if synchronous else "local"
    return (
        "wal_level = replica\nmax_wal_senders = 5\nhot_standby = on\nmax_connections = 300\n"
        "wal_keep_size = 256MB\nshared_buffers = 128MB\n"
        f"synchronous_commit = {sync}\n"
        f"synchronous_standby_names = '{synchronous_standby_names}'\n"
    )


class StandbyTopology(Topology):
    name = "standby"
    title = "PostgreSQL 15 primary + streaming standby (synchronous), pg_ctl promote on failover"
    dialect = "postgres"
    modes = ("work", "cron")
    fault_kinds = ("failover",)
    may_rerun = False
    recovery_bound_s = 10.0
    packages = ("postgresql-15",)
    #: Synchronous replication: every acknowledged commit is on the standby too.
    synchronous: ClassVar[bool] = True

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.nodes = {n: Node(workdir, n, port) for n, port in PORTS.items()}
        self.primary, self.standby = "a", "b"
        self.failovers = 0

    # --- lifecycle ---

    def start(self) -> None:
        prepare(self.workdir)
        a = self.nodes["a"]
        a.initdb()
        a.configure(replication_settings(self._sync_names("b"), self.synchronous))
        self.pids.append(a.start())
        self._add_standby("b")
        wait_until("the standby streaming", lambda: self._streaming("b"), 30)

    def stop(self) -> None:
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                node.stop("fast")
        super().stop()  # whatever is left of the pids, by pid

    def _sync_names(self, standby: str) -> str:
        return standby if self.synchronous else ""

    def _add_standby(self, name: str) -> None:
        """Make `name` a streaming standby of the current primary (a fresh base backup)."""
        node, primary = self.nodes[name], self.nodes[self.primary]
        shutil.rmtree(node.data, ignore_errors=True)
        node.data.mkdir(mode=0o700)
        chown(node.data)
        as_postgres(
            BIN / "pg_basebackup", "-D", node.data, "-R", "-X", "stream", "-c", "fast", "--no-sync",
            "-d", f"host={HOST} port={primary.port} user={USER} application_name={name}",
            timeout=300,
        )  # fmt: skip
        # Its own settings: never a synchronous standby of its own (promoted, it would wait).
        node.configure(replication_settings("", self.synchronous))
        self.pids.append(node.start())
        self.standby = name

    def _streaming(self, name: str) -> bool:
        rows = self.nodes[self.primary].sql(
            "SELECT sync_state FROM pg_stat_replication"
            f" WHERE application_name = '{name}' AND state = 'streaming'"
        )
        return bool(rows) and (rows[0][0] == "sync") == self.synchronous

    # --- where bgq connects ---

    def admin_url(self) -> str:
        return self.nodes[self.primary].url("postgres")

    def worker_url(self, database: str) -> str:
        hosts = "&".join(f"host={HOST}:{port}" for port in PORTS.values())
        return f"postgresql+psycopg://{USER}@/{database}?{hosts}&target_session_attrs=read-write&connect_timeout=3"

    # --- faults ---

    def fault(self, kind: str, faults: FaultSink) -> str:
        if kind != "failover":
            return super().fault(kind, faults)
        if self.standby is None:
            raise RuntimeError("no standby to fail over to (heal() has not rebuilt it)")
        old, new = self.nodes[self.primary], self.nodes[self.standby]
        lag = self._lag_bytes()
        faults.add("failover", detail=f"pg_ctl stop -m immediate {old.name} ({HOST}:{old.port})")
        started = time.monotonic()
        as_postgres(BIN / "pg_ctl", "-D", old.data, "-m", "immediate", "-w", "-t", "30", "stop", timeout=60)
        old.pid = None
        time.sleep(DETECT_S)
        as_postgres(BIN / "pg_ctl", "-D", new.data, "-w", "-t", "60", "promote", timeout=90)
        wait_until(f"{new.name} taking writes", new.writable, 30, 0.05)
        took = time.monotonic() - started
        faults.add("failover_done", detail=f"{new.name} ({HOST}:{new.port}) promoted")
        self.primary, self.standby = new.name, None
        self.failovers += 1
        said = (
            f"{old.name} stopped (immediate), {new.name} promoted and taking writes after {took:.1f} s"
            f" (replication lag at the stop: {lag} bytes)"
        )
        # What a failover manager does next: the old primary back as the new one's standby, so
        # that the next failover of the run has somewhere to go (heal() retries if this fails).
        started = time.monotonic()
        try:
            self.heal()
        except Exception as exc:  # the run goes on without a standby; heal() tries again
            return f"{said}; rebuilding {old.name} as its standby failed: {exc}"
        return f"{said}; {old.name} rebuilt as its standby in {time.monotonic() - started:.1f} s"

    def _lag_bytes(self) -> str:
        with contextlib.suppress(Exception):
            rows = self.nodes[self.primary].sql(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn) FROM pg_stat_replication"
            )
            return str(rows[0][0]) if rows else "?"
        return "?"

    def heal(self) -> None:
        """Rebuild the node that went down as the new primary's standby, then (synchronous)
        name it in the primary's synchronous_standby_names. fault() calls it right after the
        promotion; after a run it does nothing unless that rebuild failed."""
        if self.standby is not None:
            return
        down = next(n for n in self.nodes if n != self.primary)
        self._add_standby(down)
        primary = self.nodes[self.primary]
        primary.configure(replication_settings(self._sync_names(down), self.synchronous))
        primary.sql("SELECT pg_reload_conf()")
        wait_until(f"{down} streaming to {self.primary}", lambda: self._streaming(down), 30)

    def versions(self) -> list[str]:
        with contextlib.suppress(Exception):
            version = self.nodes[self.primary].sql("SHOW server_version")[0][0]
            mode = "synchronous" if self.synchronous else "asynchronous"
            return [f"PostgreSQL {str(version).split()[0]} primary + standby ({mode} streaming replication)"]
        return ["PostgreSQL 15"]


class AsyncStandbyTopology(StandbyTopology):
    name = "standby-async"
    title = "PostgreSQL 15 primary + streaming standby (asynchronous), pg_ctl promote on failover"
    #: A failover may lose the commits the standby had not received: results, claims, publishes.
    may_rerun = True
    synchronous = False
