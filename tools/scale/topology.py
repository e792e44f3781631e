"""What a `make scale` topology is: the nodes it starts, the URLs bgq uses on it, and its faults.

Each engine bgq scales out to (PgBouncer, a PostgreSQL primary and standby, a Galera cluster, a
RabbitMQ cluster) is one subclass of `Topology` in its own module of tools/scale/. The driver
(tools/scale/run.py) starts it, runs the chaos harness (tools/chaos/) against it with the
topology's own faults beside the harness's kills, judges every run with the chaos oracle, and
stops it. A topology only ever starts processes on loopback ports of its own and stops exactly the
pids it started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar, Protocol


class FaultSink(Protocol):
    """Where a topology records its faults (tools/chaos/fleet.py FaultLog)."""

    def add(self, kind: str, pid: int | None = None, detail: str = "", ns: int | None = None) -> None: ...


class Topology(ABC):
    """One topology. Subclasses set the class attributes and implement the abstract methods."""

    #: The --topology value and the section of docs/scale-out.md.
    name: ClassVar[str]
    #: One line for the report: what runs, e.g. "PgBouncer 1.18, pool_mode = transaction, pool 10".
    title: ClassVar[str]
    #: The database the chaos runs use: "postgres" or "mysql".
    dialect: ClassVar[str]
    #: The chaos modes (cron, work, broker, mixed) this topology's runs exercise.
    modes: ClassVar[tuple[str, ...]]
    #: The faults `fault()` can do (e.g. "failover", "node_kill"); the driver schedules them.
    fault_kinds: ClassVar[tuple[str, ...]] = ()
    #: True when a fault of this topology may undo a result that was already written (a failover
    #: to an asynchronous standby): the oracle then classifies the re-runs it explains. False: any
    #: re-run after its faults is unexplained, a failure.
    may_rerun: ClassVar[bool] = False
    #: The bound on a run's recovery: seconds from a fault's `_done` (or the fault: recovery_from)
    #: until every busy worker took a job again (None: no bound).
    recovery_bound_s: ClassVar[float | None] = 10.0
    #: Where recovery_bound_s counts from: "done" (the topology serves again: a restarted pooler,
    #: a promoted standby) or "fault" (a cluster that serves on its other nodes while one is
    #: down: the workers must be back within the bound of the kill, not of the node's rejoin).
    recovery_from: ClassVar[str] = "done"
    #: Workers of the fault-free throughput pair (direct, then through the topology).
    throughput_workers: ClassVar[int] = 4
    #: Workers of the full preset's chaos runs through the topology, by mode (the preset's for
    #: a mode not named).
    full_chaos_workers: ClassVar[dict[str, int]] = {}
    #: The least throughput through the topology, as a share of direct, that the full preset
    #: accepts (None: reported, not judged).
    throughput_floor: ClassVar[float | None] = None
    #: Debian packages `start()` needs: installed with apt-get when missing.
    packages: ClassVar[tuple[str, ...]] = ()

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir  # a fresh directory of this topology's own (data dirs, configs, logs)
        self.pids: list[int] = []  # every process start() started, in order

    # --- lifecycle ---

    @abstractmethod
    def start(self) -> None:
        """Start every node on its own loopback ports and wait (bounded) until it serves."""

    def stop(self) -> None:
        """Stop every process this topology started, by pid: SIGTERM, then SIGKILL after 15 s."""
        stop_pids(self.pids)
        self.pids.clear()

    # --- where bgq connects ---

    @abstractmethod
    def admin_url(self) -> str:
        """A SQLAlchemy URL with admin rights on a node that takes writes now (its `test` or
        `postgres` database): the harness creates, cuts and drops the run's database and reads
        the end-state snapshot through it. Called each time: after a failover it names the node
        that took over."""

    @abstractmethod
    def worker_url(self, database: str) -> str:
        """The URL the workers and the publisher use for `database` (through the pooler, a
        multi-host URL, haproxy...)."""

    def direct_admin_url(self) -> str | None:
        """The admin URL of the single server the throughput pair's direct run uses (the server
        this topology fronts, when it has one of its own); None: the machine's server."""
        return None

    def app_env(self, database: str) -> dict[str, str]:
        """Extra environment for the chaos app (tools/chaos/app.py), e.g. BGQ_CHAOS_LISTEN_URL."""
        return {}

    def amqp_urls(self) -> list[str] | None:
        """The AMQP URLs for broker mode; None: the machine's single RabbitMQ."""
        return None

    # --- faults ---

    def fault(self, kind: str, faults: FaultSink) -> str:
        """Do one fault of `kind` now, bounded in time; record it with faults.add(kind, ...) at
        the instant it strikes and faults.add(kind + "_done", ...) once the topology serves again
        (e.g. the standby promoted). Returns a one-line description for the run's log."""
        raise ValueError(f"{self.name} has no fault {kind!r}")

    def heal(self) -> None:  # noqa: B027 (a topology whose faults heal themselves keeps it)
        """Bring back what the faults left down (a killed node restarted and rejoined), bounded."""

    def versions(self) -> list[str]:
        """The versions of what runs, for the report (e.g. ["PgBouncer 1.18.0"])."""
        return []


# --- helpers every topology uses ---


def ensure_packages(packages: Sequence[str]) -> None:
    """apt-get install the Debian packages that are missing (a fresh machine has none of them)."""
    missing = [p for p in packages if not _installed(p)]
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print(f"scale: apt-get install {' '.join(missing)}", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env, timeout=1200)


def _installed(package: str) -> bool:
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Status}", package], capture_output=True, text=True)
    return out.returncode == 0 and "install ok installed" in out.stdout


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop_pids(pids: Sequence[int], grace: float = 15.0) -> None:
    """SIGTERM each pid, wait up to `grace` seconds for all, SIGKILL the rest; reap our children."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        _reap()
        time.sleep(0.1)
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    _reap()


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


class Gone(RuntimeError):
    """Raised by a `wait_until` check when what it waits for can never come (the process exited):
    the wait ends at once with this error instead of polling to its deadline."""


def wait_until(what: str, ready: Callable[[], bool], seconds: float, step: float = 0.2) -> None:
    """Poll `ready` until it is true; RuntimeError naming `what` after `seconds` (at once when
    `ready` raises Gone; any other error of `ready` counts as not ready yet)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except Gone:
            raise
        except Exception:  # noqa: S110 (not ready yet: a refused connection, a timeout)
            pass
        time.sleep(step)
    raise RuntimeError(f"scale: {what} not ready after {seconds:.0f} s")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def fresh_dir(path: Path, owner: str | None = None) -> Path:
    """An empty directory at `path` (removed first if it exists), owned by `owner` if given."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    if owner:
        shutil.chown(path, owner, owner)
    return path
