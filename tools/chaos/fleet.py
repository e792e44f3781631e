"""The worker processes of a chaos run, through the real `bgq` CLI, and the faults done to them.

Modes:
  cron    hosts (separate BGQ_LOCKS_DIR each) that start `bgq process` like cron: a new run when the
          host has none, and an overlapping one (it meets the host lock and exits) at most every
          OVERLAP_S while a run goes on;
  work    `bgq work` processes, one of them `bgq work -c 2` when there are 3 or more workers;
  broker  `bgq consume` processes, plus one cron host (`bgq process`: reaper and safety net);
  mixed   half `bgq work`, half cron hosts, on one queue.
A continuous worker that exits is started again after RESTART_S, as a supervisor would.
Every fault is appended to faults.jsonl (kind, pid, monotonic ns, wall time) before the next one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BGQ = str(Path(sys.executable).parent / "bgq")
APP = "tools.chaos.app:queue"
TICK_S = 0.5  # how often a cron host looks whether to start `bgq process`
OVERLAP_S = 20.0  # a host's long run gets an overlapping one this often (as cron would start it)
RESTART_S = 0.5  # a supervisor's restart delay for a continuous worker


@dataclass
class Unit:
    """One supervised worker: a continuous command, or a cron host that starts `bgq process` runs."""

    name: str
    args: list[str]
    cron: bool = False
    locks: Path | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    started: dict[int, float] = field(default_factory=dict)
    runs: int = 0
    exited_at: float = 0.0
    spawned_at: float = 0.0  # time.monotonic() of the last start


class FaultLog:
    """faults.jsonl: one JSON line per fault, written and flushed before the harness goes on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path.open("a", buffering=1)
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def add(self, kind: str, pid: int | None = None, detail: str = "", ns: int | None = None) -> None:
        record = {
            "kind": kind,
            "pid": pid,
            "ns": ns or time.monotonic_ns(),
            "wall": time.time(),
            "detail": detail,
        }
        with self.lock:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
            # Every fault that strikes is counted (a topology's own kinds too), not the marks of
            # its end (cont, broker_start, <kind>_done).
            if detail != "teardown" and kind not in ("cont", "broker_start") and not kind.endswith("_done"):
                self.counts[kind] = self.counts.get(kind, 0) + 1

    def close(self) -> None:
        self.file.close()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
            out.extend(int(p) for p in text.split())
    return out


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # gone: it is not running either
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


class Fleet:
    def __init__(self, mode: str, workers: int, env: dict[str, str], run_dir: Path, faults: FaultLog) -> None:
        self.env, self.logs, self.faults = env, run_dir / "logs", faults
        self.logs.mkdir(parents=True, exist_ok=True)
        self.units: list[Unit] = []
        self.stopping = False
        self.lock = threading.Lock()
        self.frozen: dict[int, float] = {}  # pid -> when to SIGCONT (monotonic s)
        self.units_of: dict[int, str] = {}  # every pid that ran callbacks -> its unit's name
        hosts = 0

        def host() -> Unit:
            nonlocal hosts
            hosts += 1
            locks = run_dir / "hosts" / f"h{hosts}"
            locks.mkdir(parents=True)
            return Unit(f"cron-h{hosts}", ["process"], cron=True, locks=locks)

        def work(i: int, concurrency: int = 1) -> Unit:
            extra = ["-c", str(concurrency)] if concurrency > 1 else []
            return Unit(f"work{i}" + (f"-c{concurrency}" if extra else ""), ["work", "--poll", "0.2", *extra])

        if mode == "cron":
            self.units = [host() for _ in range(workers)]
        elif mode == "work":
            if workers >= 3:
                self.units = [work(0, 2)] + [work(i) for i in range(1, workers - 1)]
            else:
                self.units = [work(i) for i in range(workers)]
        elif mode == "broker":
            self.units = [Unit(f"consume{i}", ["consume"]) for i in range(workers)] + [host()]
        elif mode == "mixed":
            half = max(1, workers // 2)
            self.units = [work(i) for i in range(half)] + [host() for _ in range(max(1, workers - half))]
        else:
            raise ValueError(f"unknown mode {mode!r}")
        self.thread = threading.Thread(target=self._supervise, name="chaos-supervisor", daemon=True)

    # --- processes ---

    def _spawn(self, unit: Unit) -> None:
        unit.runs += 1
        env = dict(self.env)
        if unit.locks is not None:
            env["BGQ_LOCKS_DIR"] = str(unit.locks)
        with (self.logs / f"{unit.name}.{unit.runs}.log").open("wb") as log:
            proc = subprocess.Popen(
                [BGQ, "--app", APP, *unit.args],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: teardown reaches forked children
            )
        unit.procs.append(proc)
        unit.started[proc.pid] = unit.spawned_at = time.monotonic()
        self.units_of[proc.pid] = unit.name

    def start(self) -> None:
        with self.lock:
            for unit in self.units:
                self._spawn(unit)
        self.thread.start()

    def _supervise(self) -> None:
        while not self.stopping:
            now = time.monotonic()
            with self.lock:
                for unit in self.units:
                    for proc in [p for p in unit.procs if p.poll() is not None]:
                        unit.procs.remove(proc)
                        unit.exited_at = now
                    if self.stopping:
                        break
                    if unit.cron:
                        if not unit.procs or now - unit.spawned_at > OVERLAP_S:
                            self._spawn(unit)
                    elif not unit.procs and now - unit.exited_at >= RESTART_S:
                        self._spawn(unit)
                self._note_pids()
                for pid, until in list(self.frozen.items()):
                    if now >= until:
                        self.cont(pid)
            time.sleep(TICK_S if any(u.cron for u in self.units) else 0.1)

    def _note_pids(self) -> None:
        """Remember which unit each live process (and `-c N` child) belongs to (self.lock held)."""
        for unit in self.units:
            for proc in unit.procs:
                self.units_of[proc.pid] = unit.name
                if "-c" in unit.args:
                    for child in _children(proc.pid):
                        self.units_of[child] = unit.name

    def pid_units(self) -> dict[int, str]:
        """pid -> unit name for every process seen during the run (the oracle's recovery figure)."""
        with self.lock:
            self._note_pids()
            return dict(self.units_of)

    def targets(self) -> list[tuple[int, str]]:
        """The processes that run callbacks now: (pid, unit name); a `-c N` supervisor's children."""
        out = []
        with self.lock:
            for unit in self.units:
                for proc in unit.procs:
                    if proc.poll() is not None:
                        continue
                    if "-c" in unit.args:
                        out.extend((child, unit.name) for child in _children(proc.pid))
                    else:
                        out.append((proc.pid, unit.name))
        return sorted(out)

    # --- faults ---

    def kill(self, pid: int, name: str, detail: str = "") -> bool:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.faults.add("kill", pid, detail or name)
        with self.lock:
            self.frozen.pop(pid, None)
        return True

    def stop(self, pid: int, name: str, seconds: float) -> bool:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return False
        deadline = time.monotonic() + 0.2
        while not _stopped(pid) and time.monotonic() < deadline:
            time.sleep(0.001)
        self.faults.add("stop", pid, f"{name} for {seconds:.1f} s")
        with self.lock:
            self.frozen[pid] = time.monotonic() + seconds
        return True

    def cont(self, pid: int, detail: str = "") -> None:
        self.frozen.pop(pid, None)
        ns = time.monotonic_ns()  # taken before SIGCONT: the frozen span recorded is never too long
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        self.faults.add("cont", pid, detail, ns=ns)

    # --- the end ---

    def teardown(self, grace: float = 8.0) -> None:
        """SIGCONT what is frozen, SIGTERM every worker (the running job finishes), SIGKILL stragglers."""
        self.stopping = True
        if self.thread.is_alive():
            self.thread.join(5)
        with self.lock:
            frozen = list(self.frozen)
        for pid in frozen:
            self.cont(pid, "teardown")
        # Only processes not yet reaped: the pid of one that was (a worker the harness killed
        # earlier) may belong to someone else by now, and as a process group a restarted server's
        # (a Galera node leads its own session): a killpg there once shut a database down.
        procs = [p for u in self.units for p in u.procs if p.poll() is None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        for proc in procs:
            if proc.poll() is None:
                for pid in [*_children(proc.pid), proc.pid]:
                    self.kill(pid, "", "teardown")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
