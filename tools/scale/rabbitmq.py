"""A three-node RabbitMQ 3.10 cluster with quorum queues: bgq's broker mode on a cluster.

Nodes bgqscale1..3@localhost, AMQP on 127.0.0.1:5681-5683, Erlang distribution on 25681-25683
(epmd on 4369 is the machine's, shared), each with its own data, log, pid and (empty) enabled
plugins file, and an Erlang cookie of the topology's own (HOME=<workdir>/home/.erlang.cookie), so
`rabbitmqctl` reaches only these nodes; the machine's broker (rabbit@localhost, 5672/25672) is
never touched. Nodes 2 and 3 join node 1 (`stop_app; join_cluster; start_app`). The database is
the machine's PostgreSQL (or MariaDB: the "rabbitmq-mysql" topology).

Every queue bgq declares is a quorum queue (BGQ_CHAOS_QUEUE_TYPE=quorum: RabbitMQ(queue_type=
"quorum")), and the consumers get the three URLs (each process starts at a random node).

Fault "mq_node_kill": SIGKILL of the node most consumers are attached to (`rabbitmqctl
list_connections` on each node; connections named "bgq consumer"), then the node is started again
and waits until it runs in the cluster (`await_startup`, and its cluster status lists 3 running
nodes): faults.add("mq_node_kill") at the SIGKILL, faults.add("mq_node_kill_done") then.

Stand-alone check: `.venv/bin/python -m tools.scale.rabbitmq` starts the cluster, prints the
cluster status, kills and restarts one node, and stops it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import ClassVar

from tools.scale.topology import FaultSink, Topology, alive, fresh_dir, port_open, stop_pids, wait_until

RABBIT_BIN = Path(os.environ.get("BGQ_SCALE_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))
NODES = 3
AMQP_PORT = 5681  # node i (1-based) listens on AMQP_PORT + i - 1
DIST_PORT = 25681
POSTGRES_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MYSQL_ADMIN = "mysql+pymysql://root@127.0.0.1:3306/test"
#: How long a node may take to start (a fresh node boots in ~5 s on 2 idle cores; a loaded machine
#: and a quorum queue recovery take longer).
START_S = 120.0


class RabbitCluster(Topology):
    name = "rabbitmq"
    title = "RabbitMQ 3.10 cluster, 3 nodes, quorum queues (PostgreSQL)"
    dialect = "postgres"
    modes = ("broker",)
    fault_kinds = ("mq_node_kill",)
    packages = ("rabbitmq-server",)
    #: A node kill never undoes a written result: the database is the single server.
    may_rerun: ClassVar[bool] = False
    #: The two other nodes keep serving while one is down: consumers must be back within 10 s of
    #: the kill (failing over to another node), not of the killed node's rejoin.
    recovery_from: ClassVar[str] = "fault"
    recovery_bound_s: ClassVar[float | None] = 10.0

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.home = workdir / "home"
        self.procs: dict[int, subprocess.Popen[bytes]] = {}  # node index -> its rabbitmq-server

    # --- nodes ---

    def node(self, i: int) -> str:
        return f"bgqscale{i}@localhost"

    def _env(self, i: int | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")}
        env.update(
            HOME=str(self.home),
            RABBITMQ_CONF_ENV_FILE=str(self.workdir / "rabbitmq-env.conf"),  # not /etc/rabbitmq's
            # rabbitmq-env.conf of the machine's broker sets this: the cluster's distribution on loopback
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        if i is not None:
            base = self.workdir / f"node{i}"
            env.update(
                RABBITMQ_NODENAME=self.node(i),
                RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
                RABBITMQ_NODE_PORT=str(AMQP_PORT + i - 1),
                RABBITMQ_DIST_PORT=str(DIST_PORT + i - 1),
                RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
                RABBITMQ_LOG_BASE=str(base / "log"),
                RABBITMQ_PID_FILE=str(base / "pid"),
                RABBITMQ_ENABLED_PLUGINS_FILE=str(self.workdir / "enabled_plugins"),
                RABBITMQ_ENABLED_PLUGINS="",
                RABBITMQ_CONFIG_FILE=str(base / "rabbitmq.conf"),
                RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            )
        return env

    def ctl(self, i: int, *args: str, timeout: float = 60) -> str:
        """`rabbitmqctl -n bgqscale<i>@localhost ARGS` with the cluster's cookie; RuntimeError if it fails."""
        proc = subprocess.run(
            [str(RABBIT_BIN / "rabbitmqctl"), "-n", self.node(i), *args],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"rabbitmqctl -n {self.node(i)} {' '.join(args)}: "
                f"{(proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:]}"
            )
        return proc.stdout

    def _start_node(self, i: int) -> None:
        base = self.workdir / f"node{i}"
        (base / "log").mkdir(parents=True, exist_ok=True)
        log = (base / "log" / "server.out").open("ab")
        proc = subprocess.Popen(
            [str(RABBIT_BIN / "rabbitmq-server")],
            env=self._env(i),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.procs[i] = proc
        self.pids.append(proc.pid)

    def _await(self, i: int) -> None:
        """Until node `i` runs: its AMQP port, then `await_startup` (which fails at once while the
        node has not registered with epmd yet, hence the retries)."""
        port = AMQP_PORT + i - 1
        wait_until(f"RabbitMQ node {self.node(i)}", lambda: port_open(port), START_S, step=0.5)
        wait_until(
            f"RabbitMQ node {self.node(i)} started",
            lambda: bool(self.ctl(i, "await_startup", "--timeout", "30", timeout=45) or True),
            START_S,
            step=2.0,
        )

    def running_nodes(self, i: int) -> list[str]:
        """The nodes node `i` sees running in its cluster."""
        import json

        status = json.loads(self.ctl(i, "cluster_status", "--formatter", "json", timeout=30))
        return sorted(status.get("running_nodes", []))

    def start(self) -> None:
        fresh_dir(self.home)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(f"BGQSCALE{os.getpid()}{time.time_ns()}")
        cookie.chmod(0o400)
        (self.workdir / "rabbitmq-env.conf").write_text("")
        (self.workdir / "enabled_plugins").write_text("[].\n")
        for i in range(1, NODES + 1):
            if port_open(AMQP_PORT + i - 1) or port_open(DIST_PORT + i - 1):
                raise RuntimeError(f"scale: port {AMQP_PORT + i - 1} or {DIST_PORT + i - 1} is in use")
            base = fresh_dir(self.workdir / f"node{i}")
            (base / "rabbitmq.conf").write_text(
                f"listeners.tcp.default = 127.0.0.1:{AMQP_PORT + i - 1}\n"
                "loopback_users.guest = true\n"
                # the cluster never partitions for good on one machine; a node that was killed
                # rejoins by itself at its restart
                "cluster_partition_handling = pause_minority\n"
                "log.console = true\nlog.console.level = warning\nlog.file.level = info\n"
            )
            self._start_node(i)
        for i in range(1, NODES + 1):
            self._await(i)
        for i in range(2, NODES + 1):
            self.ctl(i, "stop_app")
            self.ctl(i, "join_cluster", self.node(1), timeout=120)
            self.ctl(i, "start_app", timeout=120)
        wait_until("3 running nodes", lambda: len(self.running_nodes(1)) == NODES, 60, step=1)

    def stop(self) -> None:
        stop_pids(self.pids, grace=30)
        self.pids.clear()
        self.procs.clear()

    # --- where bgq connects ---

    def admin_url(self) -> str:
        return POSTGRES_ADMIN

    def worker_url(self, database: str) -> str:
        return POSTGRES_ADMIN.rsplit("/", 1)[0] + "/" + database

    def app_env(self, database: str) -> dict[str, str]:
        return {"BGQ_CHAOS_QUEUE_TYPE": "quorum"}

    def amqp_urls(self) -> list[str]:
        return [f"amqp://guest:guest@127.0.0.1:{AMQP_PORT + i}/" for i in range(NODES)]

    # --- faults ---

    def consumers_per_node(self) -> dict[int, int]:
        """How many bgq consumer connections each node holds (one listing covers the cluster:
        `list_connections` on any running node lists every node's connections)."""
        for i in range(1, NODES + 1):
            proc = self.procs.get(i)
            if proc is None or proc.poll() is not None:
                continue
            try:
                columns = ("--no-table-headers", "pid", "client_properties")
                listing = self.ctl(i, "--quiet", "list_connections", *columns, timeout=30)
            except (RuntimeError, subprocess.TimeoutExpired):
                continue
            counts = dict.fromkeys(range(1, NODES + 1), 0)
            names = {self.node(n): n for n in counts}
            for line in listing.splitlines():
                pid, _, rest = line.partition("\t")  # a pid names its node: <node.1.2.3>
                node = pid.strip("<>").rsplit(".", 3)[0]
                if node in names and "bgq consumer" in rest:
                    counts[names[node]] += 1
            return counts
        return {}

    def fault(self, kind: str, faults: FaultSink) -> str:
        if kind != "mq_node_kill":
            return super().fault(kind, faults)
        counts = self.consumers_per_node()
        live = [i for i in range(1, NODES + 1) if i in self.procs and alive(self.procs[i].pid)]
        if not live:
            raise RuntimeError("no live RabbitMQ node")
        victim = max(live, key=lambda i: (counts.get(i, 0), -i))
        proc = self.procs[victim]
        # rabbitmq-server (in the foreground) is a shell that runs the Erlang VM as its child, in
        # the session start_new_session gave it: SIGKILL the VM and every helper of the session.
        session = self._session(victim)
        beam = next((p for p, name in session.items() if name.startswith("beam")), proc.pid)
        for pid in sorted(session, key=lambda p: p != beam):  # the VM first
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        faults.add("mq_node_kill", beam, f"{self.node(victim)} ({counts.get(victim, 0)} consumers)")
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        port = AMQP_PORT + victim - 1
        wait_until(
            f"{self.node(victim)} gone",
            lambda: not any(alive(p) for p in session) and not port_open(port),
            30,
            step=0.1,
        )
        self.pids.remove(proc.pid)
        self._start_node(victim)
        self._await(victim)
        # each rabbitmqctl call boots an Erlang VM (a second of CPU on a 2-core machine): poll slowly
        wait_until(
            f"{self.node(victim)} back in the cluster",
            lambda: len(self.running_nodes(victim)) == NODES,
            60,
            step=2.0,
        )
        faults.add("mq_node_kill_done", self.procs[victim].pid, self.node(victim))
        return (
            f"SIGKILL {self.node(victim)} (beam pid {beam}, {counts.get(victim, 0)} of "
            f"{sum(counts.values())} consumers on it); back in the cluster after "
            f"{time.monotonic() - killed:.1f} s"
        )

    def _session(self, i: int) -> dict[int, str]:
        """pid -> command name of node `i`'s session (its rabbitmq-server script, the VM, the
        VM's helpers)."""
        sid = self.procs[i].pid
        out = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid:  # field 6 of stat: the session id
                    out[int(entry.name)] = (entry / "comm").read_text().strip()
        return out

    def heal(self) -> None:
        for i in range(1, NODES + 1):
            proc = self.procs.get(i)
            if proc is None or proc.poll() is not None:
                if proc is not None and proc.pid in self.pids:
                    self.pids.remove(proc.pid)
                self._start_node(i)
        for i in range(1, NODES + 1):
            self._await(i)
        wait_until("3 running nodes", lambda: len(self.running_nodes(1)) == NODES, 90, step=1)

    def versions(self) -> list[str]:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            return [f"RabbitMQ {self.ctl(1, 'version', timeout=30).strip()} (3 nodes, quorum queues)"]
        return ["RabbitMQ unknown"]


class RabbitClusterMysql(RabbitCluster):
    name = "rabbitmq-mysql"
    title = "RabbitMQ 3.10 cluster, 3 nodes, quorum queues (MariaDB)"
    dialect = "mysql"

    def admin_url(self) -> str:
        return MYSQL_ADMIN

    def worker_url(self, database: str) -> str:
        return MYSQL_ADMIN.rsplit("/", 1)[0] + "/" + database


def main() -> None:
    import tempfile

    class Faults:
        def add(self, kind: str, pid: int | None = None, detail: str = "", ns: int | None = None) -> None:
            print(f"fault {kind} pid {pid} {detail}", flush=True)

    cluster = RabbitCluster(Path(tempfile.mkdtemp(prefix="bgqscale-rabbitmq-")))
    try:
        started = time.monotonic()
        cluster.start()
        print(f"started in {time.monotonic() - started:.1f} s: {cluster.running_nodes(1)}", flush=True)
        print(cluster.versions(), cluster.consumers_per_node(), flush=True)
        print(cluster.fault("mq_node_kill", Faults()), flush=True)
        cluster.heal()
        print(cluster.running_nodes(2), flush=True)
    finally:
        cluster.stop()
        print("stopped; pids left:", [p for p in cluster.pids if alive(p)], flush=True)


if __name__ == "__main__":
    main()
