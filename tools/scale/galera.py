"""A three-node MariaDB Galera cluster on loopback, haproxy 2.6 in front (docs/scale-out/galera.md).

Nodes: mariadbd 10.11 with galera-4 (wsrep_on, binlog_format ROW, innodb_autoinc_lock_mode 2),
each with its own datadir, option file, socket and pid file in the workdir, run as user mysql,
never reading /etc/mysql (each gets `--defaults-file` of its own, which the SST scripts read too)
and never touching the machine's server on 3306. Ports: mysqld 23061-23063, gmcast 24671-24673,
IST 24681-24683, rsync SST 24441-24443, haproxy 23060: all below the kernel's ephemeral range
(32768-60999), where a node restarted under load could find its port taken as the local end of
some client's connection (seen: `Bind on TCP/IP port ... Address already in use` on 33062). The
first node bootstraps the cluster (`--wsrep-new-cluster`), the others join it by SST.

haproxy balances the workers' connections over the nodes (`balance leastconn`), and drops a node
that is not Synced: its health check is an external check that asks the node for
`wsrep_local_state` (4 = Synced) every second. A plain `option mysql-check` only reads the
server's handshake, which a joining, donating or non-primary node still sends, while every query
on it fails (1047 "WSREP has not yet prepared node for application use"). A node marked down has
its sessions shut (`on-marked-down shutdown-sessions`), so no worker keeps talking to it.

The fault "node_kill": SIGKILL one node (in turn) under load, then restart it: its position is
recovered from InnoDB (`--wsrep-recover`) and given as `wsrep_start_position`, so it rejoins by
IST from a donor's gcache (an SST by rsync when the gcache no longer has it), and "node_kill_done"
is recorded once it is Synced again and haproxy's check takes it back. A node that is not Synced
IST_SECONDS after its restart (it exited, or its transfer stalled) is killed again and rejoins by
a full SST; the fault's line in the run log says so, with the node's log.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from tools.scale.topology import FaultSink, Gone, Topology, alive, fresh_dir, port_open, stop_pids, wait_until

PROVIDER = "/usr/lib/galera/libgalera_smm.so"
MYSQLD_PORTS = (23061, 23062, 23063)
GMCAST_PORTS = (24671, 24672, 24673)
IST_PORTS = (24681, 24682, 24683)
SST_PORTS = (24441, 24442, 24443)
HAPROXY_PORT = 23060
HAPROXY_STATS_PORT = 23069
#: How long a node may take to start, to join (SST included) and to become Synced.
JOIN_SECONDS = 120.0
#: How long a restarted node may take to rejoin by IST before it is killed again and made to
#: rejoin by a full SST (what an operator does with a node whose IST went wrong).
IST_SECONDS = 60.0

#: The EVS timeouts: a SIGKILLed node's TCP connections reset at once, but the group only drops
#: it after evs.suspect_timeout (default 5 s); until then commits wait for it. Only that one is
#: shortened: an install_timeout of 4 s expired on this 2-core machine under load while a node
#: rejoined, and every node went non-primary for a second (1047, 1180 on all of them).
EVS = (
    "evs.keepalive_period=PT1S;evs.suspect_timeout=PT3S;evs.inactive_timeout=PT10S;evs.install_timeout=PT7.5S"
)

CHECK_SCRIPT = """#!/bin/sh
# haproxy external check: the node ($3:$4) is up only while it is Synced (wsrep_local_state 4)
# and ready (wsrep_ready ON): a joiner, a donor or a non-primary node is down for haproxy.
out=$(timeout 2 mariadb --no-defaults --protocol=TCP -h "$3" -P "$4" -uroot -N -B \\
  -e "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_local_state', 'wsrep_ready')" 2>/dev/null)
echo "$out" | grep -q "wsrep_local_state.4" && echo "$out" | grep -q "wsrep_ready.ON"
"""


class Galera(Topology):
    name = "galera"
    title = "MariaDB 10.11 Galera 4, 3 nodes, haproxy 2.6 leastconn (drops a non-Synced node)"
    dialect = "mysql"
    modes = ("work", "cron", "broker")
    fault_kinds = ("node_kill",)
    may_rerun = False  # a commit is certified on every node before it returns: none is undone
    # The two other nodes keep serving: counted from the kill, workers are back once haproxy's
    # check dropped the dead node (1 s) and the group dropped it from its view (suspect_timeout 3 s).
    recovery_from = "fault"
    recovery_bound_s = 10.0
    packages = ("galera-4", "mariadb-server", "rsync", "haproxy", "socat")

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.node_pids: dict[int, int] = {}  # node index -> mariadbd pid
        self.haproxy_pid: int | None = None
        self.kills = 0
        self.crashes = 0  # nodes that exited by themselves (heal() restarted them)

    # --- lifecycle ---

    def start(self) -> None:
        os.chmod(self.workdir, 0o755)  # mkdtemp makes it 0700: user mysql must reach its datadir
        for i in range(3):
            self._install(i)
        self._start_node(0, bootstrap=True)
        self._grant(0)
        for i in (1, 2):
            self._start_node(i)
        for i in range(3):
            self._wait_synced(i)
        self._start_haproxy()

    def stop(self) -> None:
        stop_pids(self.pids, grace=30.0)
        self.pids.clear()
        self.node_pids.clear()
        self.haproxy_pid = None

    # --- URLs ---

    def node_url(self, i: int, database: str = "test") -> str:
        return f"mysql+pymysql://root@127.0.0.1:{MYSQLD_PORTS[i]}/{database}"

    def node_urls(self, database: str) -> list[str]:
        return [self.node_url(i, database) for i in range(3)]

    def admin_url(self) -> str:
        for i in range(3):
            if i in self.node_pids and self._state(i) == "Synced":
                return self.node_url(i)
        raise RuntimeError("galera: no node is Synced")

    def worker_url(self, database: str) -> str:
        return f"mysql+pymysql://root@127.0.0.1:{HAPROXY_PORT}/{database}"

    # --- faults ---

    def fault(self, kind: str, faults: FaultSink) -> str:
        if kind != "node_kill":
            return super().fault(kind, faults)
        i = self.kills % 3
        self.kills += 1
        pid = self.node_pids[i]
        # The node's whole process group (it leads its own session): mariadbd and any SST script
        # or rsync daemon it started die with it, as on a host that crashed; an rsync left behind
        # would hold the node's SST port for its next join.
        os.killpg(pid, signal.SIGKILL)
        faults.add("node_kill", pid=pid, detail=f"node {i + 1} (port {MYSQLD_PORTS[i]})")
        started = time.monotonic()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        self.pids.remove(pid)
        del self.node_pids[i]
        # Restart only once the others have dropped the dead incarnation from their view: a node
        # that comes back while it is still a member makes a confused view change.
        others = [j for j in range(3) if j != i]
        wait_until(
            f"galera nodes {[j + 1 for j in others]} without node {i + 1}",
            lambda: all(self._status(j, "WSREP_CLUSTER_SIZE") == "2" for j in others),
            30,
            0.2,
        )
        retried = self._rejoin(i)
        # Taking work again: Synced, and haproxy's check (1 s, rise 2) has it up again.
        wait_until(f"haproxy up on node {i + 1}", lambda: self._haproxy_up(i), 15)
        faults.add("node_kill_done", pid=self.node_pids[i], detail=f"node {i + 1} Synced")
        how = self._join_kind(i) + (f" ({retried})" if retried else "")
        took = time.monotonic() - started
        return f"galera: SIGKILL node {i + 1} (pid {pid}); rejoined by {how}, Synced after {took:.1f} s"

    def heal(self) -> None:
        """Bring every node back: one the fault left down, and one that exited by itself (a
        server crash is the cluster's to survive too: it is said, with the node's log, and the
        node rejoins like a killed one)."""
        for i in range(3):
            pid = self.node_pids.get(i)
            if pid is not None and not alive(pid):
                print(
                    f"galera: node {i + 1} (pid {pid}) exited by itself; log:\n{self._log_tail(i)}",
                    flush=True,
                )
                self.crashes += 1
                del self.node_pids[i]
                with contextlib.suppress(ValueError):
                    self.pids.remove(pid)
            if i not in self.node_pids:
                self._rejoin(i)
        for i in range(3):
            self._wait_synced(i)

    def _rejoin(self, i: int) -> str:
        """Restart node `i` after its death and wait until it is Synced: by IST from its recovered
        position; when that does not make it Synced within IST_SECONDS (its process exited, or
        the transfer stalled), kill it again and rejoin by a full SST (its grastate.dat goes, so
        the donor sends every file). Returns what it had to do beyond the IST ("" when nothing);
        RuntimeError, with the node's log, when the SST does not make it Synced either."""
        try:
            started = time.monotonic()
            self._restart(i, seconds=IST_SECONDS)
            self._wait_synced(i, max(1.0, IST_SECONDS - (time.monotonic() - started)))
            return ""
        except RuntimeError as exc:
            first = f"{exc}".splitlines()[0]
            print(f"galera: node {i + 1} not Synced by IST ({first}); log:\n{self._log_tail(i)}", flush=True)
        pid = self.node_pids.pop(i, None)
        if pid is not None:
            stop_pids([pid], grace=5.0)
            with contextlib.suppress(ValueError):
                self.pids.remove(pid)
        (self._dir(i) / "data" / "grastate.dat").unlink(missing_ok=True)
        self._restart(i, recover=False)
        self._wait_synced(i)
        return f"after an IST that did not finish in {IST_SECONDS:.0f} s: {first}"

    def versions(self) -> list[str]:
        out = []
        with contextlib.suppress(Exception):
            row = self._query(
                self._synced_index(),
                "SELECT VERSION(), VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS"
                " WHERE VARIABLE_NAME = 'WSREP_PROVIDER_VERSION'",
            )
            out.append(f"MariaDB {row[0]}, Galera {row[1].split('(')[0]}")
        with contextlib.suppress(Exception):
            v = subprocess.run(["haproxy", "-v"], capture_output=True, text=True, timeout=10).stdout
            out.append(v.splitlines()[0].split(" - ")[0])
        return out

    # --- nodes ---

    def _dir(self, i: int) -> Path:
        return self.workdir / f"node{i + 1}"

    def _cnf(self, i: int) -> Path:
        return self.workdir / f"node{i + 1}.cnf"

    def _install(self, i: int) -> None:
        node = fresh_dir(self._dir(i), owner="mysql")
        data = node / "data"
        cluster = ",".join(f"127.0.0.1:{p}" for p in GMCAST_PORTS)
        options = (
            f"gmcast.listen_addr=tcp://127.0.0.1:{GMCAST_PORTS[i]};ist.recv_addr=127.0.0.1:{IST_PORTS[i]};"
            f"gcache.size=256M;{EVS}"
        )
        self._cnf(i).write_text(
            "[mysqld]\n"
            f"datadir={data}\n"
            f"socket={node}/mysqld.sock\n"
            f"pid-file={node}/mysqld.pid\n"
            f"log-error={node}/error.log\n"
            f"port={MYSQLD_PORTS[i]}\n"
            "bind-address=127.0.0.1\n"
            "user=mysql\n"
            "skip-name-resolve=OFF\n"
            "innodb_buffer_pool_size=128M\n"
            "innodb_log_file_size=64M\n"
            "innodb_flush_log_at_trx_commit=2\n"
            "max_connections=300\n"
            "binlog_format=ROW\n"
            "default_storage_engine=InnoDB\n"
            # bgq's procedures need a utf8mb4 database (MariaDB's own default is latin1; Debian's
            # /etc/mysql, which these nodes never read, sets utf8mb4).
            "character-set-server=utf8mb4\n"
            "collation-server=utf8mb4_general_ci\n"
            "innodb_autoinc_lock_mode=2\n"
            "wsrep_on=ON\n"
            f"wsrep_provider={PROVIDER}\n"
            "wsrep_cluster_name=bgq_galera\n"
            f"wsrep_cluster_address=gcomm://{cluster}\n"
            f"wsrep_node_name=node{i + 1}\n"
            "wsrep_node_address=127.0.0.1\n"
            f"wsrep_node_incoming_address=127.0.0.1:{MYSQLD_PORTS[i]}\n"
            f'wsrep_provider_options="{options}"\n'
            "wsrep_sst_method=rsync\n"
            f"wsrep_sst_receive_address=127.0.0.1:{SST_PORTS[i]}\n"
            "wsrep_slave_threads=2\n"
            "[client]\n"
            f"socket={node}/mysqld.sock\n"
        )
        os.chmod(self._cnf(i), 0o644)
        subprocess.run(
            ["mariadb-install-db", f"--defaults-file={self._cnf(i)}", "--user=mysql",
             "--auth-root-authentication-method=normal", "--skip-test-db"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip

    def _start_node(
        self, i: int, bootstrap: bool = False, position: str | None = None, seconds: float = JOIN_SECONDS
    ) -> None:
        args = ["mariadbd", f"--defaults-file={self._cnf(i)}"]
        if bootstrap:
            args.append("--wsrep-new-cluster")
        if position:
            args.append(f"--wsrep_start_position={position}")
        log = open(self._dir(i) / "stdout.log", "ab")  # noqa: SIM115 (kept by the child)
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.pids.append(proc.pid)
        self.node_pids[i] = proc.pid
        wait_until(f"galera node {i + 1} port {MYSQLD_PORTS[i]}", lambda: self._serving(i), seconds, 0.3)

    def _serving(self, i: int) -> bool:
        pid = self.node_pids.get(i)
        if pid is None or not alive(pid):
            raise Gone(f"galera: node {i + 1} exited:\n{self._log_tail(i)}")
        return port_open(MYSQLD_PORTS[i])

    def _log_tail(self, i: int, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return (self._dir(i) / "error.log").read_text(errors="replace")[-chars:]
        return "(no error.log)"

    def _restart(self, i: int, recover: bool = True, seconds: float = JOIN_SECONDS) -> None:
        """Start a node that died: its recovered position makes the join an IST when it can
        (`recover` False: no position, a full SST). Its saved primary component (gvwstate.dat,
        pc.recovery) is the view it died in: it is for a whole cluster that crashed, not for
        one node rejoining a running cluster, so it goes."""
        (self._dir(i) / "data" / "gvwstate.dat").unlink(missing_ok=True)
        if not recover:
            self._start_node(i)
            return
        position = None
        out = subprocess.run(
            ["mariadbd", f"--defaults-file={self._cnf(i)}", "--wsrep-recover",
             f"--log-error={self._dir(i)}/recover.log"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        found = re.findall(r"Recovered position: (\S+:-?\d+)", (self._dir(i) / "recover.log").read_text())
        if out.returncode == 0 and found:
            position = found[-1]
        self._start_node(i, position=position, seconds=seconds)

    def _grant(self, i: int) -> None:
        # root@localhost (no password) serves the socket and 'localhost'; TCP from 127.0.0.1 with
        # name resolution on maps to it too, but say it explicitly for the harness and haproxy.
        self._query(
            i,
            "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';"
            " GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
            " CREATE DATABASE IF NOT EXISTS test",
            socket=True,
        )

    def _query(self, i: int, sql: str, socket: bool = False) -> list[str]:
        where = (
            [f"--socket={self._dir(i)}/mysqld.sock"]
            if socket
            else ["--protocol=TCP", "-h127.0.0.1", f"-P{MYSQLD_PORTS[i]}"]
        )
        out = subprocess.run(
            ["mariadb", "--no-defaults", *where, "-uroot", "-N", "-B", "-e", sql],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        if out.returncode:
            raise RuntimeError(f"galera node {i + 1}: {out.stderr.strip()}")
        return out.stdout.rstrip("\n").split("\t") if out.stdout.strip() else []

    def _state(self, i: int) -> str | None:
        return self._status(i, "WSREP_LOCAL_STATE_COMMENT")

    def _status(self, i: int, name: str) -> str | None:
        try:
            row = self._query(i, "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS"
                              f" WHERE VARIABLE_NAME = '{name}'")  # fmt: skip
        except (RuntimeError, subprocess.TimeoutExpired):
            return None
        return row[0] if row else None

    def _synced_index(self) -> int:
        for i in range(3):
            if i in self.node_pids and self._state(i) == "Synced":
                return i
        raise RuntimeError("galera: no node is Synced")

    def _wait_synced(self, i: int, seconds: float = JOIN_SECONDS) -> None:
        try:
            wait_until(
                f"galera node {i + 1} Synced",
                lambda: self._serving(i) and self._state(i) == "Synced",
                seconds,
                0.3,
            )
        except Gone:
            raise
        except RuntimeError as exc:  # still running, not Synced: say in which state, with its log
            raise RuntimeError(
                f"{exc} (state {self._state(i)!r}); node {i + 1} log:\n{self._log_tail(i)}"
            ) from None

    def _join_kind(self, i: int) -> str:
        text = (self._dir(i) / "error.log").read_text(errors="replace")
        last = text.rfind("Starting MariaDB")
        tail = text[last:] if last >= 0 else text
        if "IST received" in tail or "Receiving IST" in tail:
            return "IST"
        if "SST" in tail and "sst" in tail.lower():
            return "SST"
        return "state transfer"

    # --- haproxy ---

    def _start_haproxy(self) -> None:
        check = self.workdir / "galera-check.sh"
        check.write_text(CHECK_SCRIPT)
        os.chmod(check, 0o755)
        servers = "\n".join(
            f"    server node{i + 1} 127.0.0.1:{MYSQLD_PORTS[i]} check inter 1s fall 1 rise 2"
            " on-marked-down shutdown-sessions"
            for i in range(3)
        )
        cfg = self.workdir / "haproxy.cfg"
        cfg.write_text(
            "global\n"
            "    insecure-fork-wanted\n"
            "    external-check\n"
            "    maxconn 2000\n"
            "defaults\n"
            "    mode tcp\n"
            "    timeout connect 2s\n"
            "    timeout client 1h\n"
            "    timeout server 1h\n"
            f"listen galera\n    bind 127.0.0.1:{HAPROXY_PORT}\n"
            "    balance leastconn\n"
            "    option external-check\n"
            f"    external-check command {check}\n"
            '    external-check path "/usr/bin:/bin"\n'
            f"{servers}\n"
            f"listen stats\n    bind 127.0.0.1:{HAPROXY_STATS_PORT}\n    mode http\n    stats enable\n"
            "    stats uri /\n"
        )
        log = open(self.workdir / "haproxy.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        log.close()
        self.pids.append(proc.pid)
        self.haproxy_pid = proc.pid
        wait_until("haproxy", lambda: all(self._haproxy_up(i) for i in range(3)), 30)

    def _haproxy_up(self, i: int) -> bool:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{HAPROXY_STATS_PORT}/;csv", timeout=2) as r:
            rows = r.read().decode().splitlines()
        for row in rows:
            cols = row.split(",")
            if len(cols) > 17 and cols[0] == "galera" and cols[1] == f"node{i + 1}":
                return cols[17] == "UP"
        return False
