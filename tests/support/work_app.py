"""The application `bgq work` runs in the tests: `bgq --app tests.support.work_app:queue work`.

Configured by environment variables (set by tests/test_work*.py):
  BGQ_TEST_WORK_URL, BGQ_TEST_WORK_TABLE  the installed test table
  BGQ_TEST_WORK_LEDGER                   the ledger table the callbacks write start/end events to
  BGQ_TEST_WORK_STALLED                  stalled_job_timeout (default 3600)
  BGQ_TEST_WORK_BROKER                   if set, a (dummy) producer: a broker-mode queue
  BGQ_TEST_WORK_BEAT, BGQ_TEST_WORK_DEAD_AFTER  worker_heartbeat_interval, worker_dead_after (5, 30)

The ledger (one row per event, `seq` in commit order) is what the tests read: a callback writes
'start' before its work and 'end' after it, each in its own committed transaction, so for two
jobs of one group "no overlap" means their events alternate start, end, start, end in seq order.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bgq import Queue
from tests.support.cli import BGQ, bgq_vars
from tests.support.helpers import wait_until

_engines: dict[tuple[int, str], sa.Engine] = {}


def read_ledger(url: str, ledger: str) -> list[dict[str, Any]]:
    """Every event in seq order: {seq, token, grp, event, pid, at}."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT seq, token, grp, event, pid, at FROM {ledger} ORDER BY seq"
            ).mappings()
            return [dict(r) for r in rows]
    finally:
        engine.dispose()


def _engine() -> sa.Engine:
    """This process's ledger engine: a forked child (`bgq work -c N`) never reuses the parent's sockets."""
    key = (os.getpid(), os.environ["BGQ_TEST_WORK_URL"])
    if key not in _engines:
        for (pid, url), inherited in list(_engines.items()):
            if pid != key[0]:
                inherited.dispose(close=False)
                del _engines[(pid, url)]
        _engines[key] = sa.create_engine(key[1])
    return _engines[key]


def dispose() -> None:
    """Close this process's ledger connections (the test process, after a test)."""
    for engine in _engines.values():
        engine.dispose()
    _engines.clear()


def write(event: str, token: str, grp: str | None = None) -> None:
    with _engine().begin() as conn:
        conn.exec_driver_sql(
            f"INSERT INTO {os.environ['BGQ_TEST_WORK_LEDGER']} (token, grp, event, pid, at) "
            "VALUES (%s, %s, %s, %s, %s)",
            (token, grp, event, os.getpid(), time.time()),
        )


def ledger(token: str, grp: str | None = None, seconds: float = 0.0) -> None:
    """A job of the proofs: start, a short random pause (or `seconds`), end."""
    write("start", token, grp)
    time.sleep(seconds if seconds else random.uniform(0, 0.004))  # real: a job's run time in `bgq work`
    write("end", token, grp)


def slow_once(token: str, grp: str | None = None, seconds: float = 30.0) -> None:
    """Slow on its first run only (a later run finds its earlier 'start' in the ledger): the job a
    test SIGKILLs its worker in."""
    with _engine().connect() as conn:
        ran_before = conn.exec_driver_sql(
            f"SELECT COUNT(*) FROM {os.environ['BGQ_TEST_WORK_LEDGER']} WHERE token = %s AND event = 'start'",
            (token,),
        ).scalar_one()
    ledger(token, grp, 0.001 if ran_before else seconds)


def fail(*_args: Any) -> None:
    """A job that fails for good (a programming error: TypeError)."""
    raise TypeError("tests.support.work_app:fail always fails")


def queue() -> Queue:
    """The factory `--app tests.support.work_app:queue` calls; it logs a 'ready' event for its process."""
    built = Queue(
        callbacks={"ledger": ledger, "slow_once": slow_once, "noop": lambda *a, **k: None, "fail": fail},
        database_url=os.environ["BGQ_TEST_WORK_URL"],
        table_name=os.environ["BGQ_TEST_WORK_TABLE"],
        queue="general",
        priorities=[1, 2, 3],
        stalled_job_timeout=int(os.environ.get("BGQ_TEST_WORK_STALLED", "3600")),
        producer=object() if os.environ.get("BGQ_TEST_WORK_BROKER") else None,  # bgq work refuses it
        worker_heartbeat_interval=int(os.environ.get("BGQ_TEST_WORK_BEAT", "5")),
        worker_dead_after=int(os.environ.get("BGQ_TEST_WORK_DEAD_AFTER", "30")),
    )
    if os.environ.get("BGQ_TEST_WORK_LEDGER"):
        write("ready", "-")
    return built


def crashing_queue() -> Queue:
    """`--app tests.support.work_app:crashing_queue`: queue(), but no process other than the one that
    built it can open a database connection: each forked `bgq work -c N` worker crashes at its
    start, while the supervisor's own checks (in the building process) pass."""
    built = queue()
    builder = os.getpid()

    def refuse(dbapi_connection: Any, record: Any) -> None:
        if os.getpid() != builder:
            raise RuntimeError("tests.support.work_app:crashing_queue: this worker cannot start")

    sa.event.listen(sa.engine.Engine, "connect", refuse)
    return built


# --- for the tests: `bgq work` processes on this app ---

ROOT = (
    Path(__file__).resolve().parents[2]
)  # the repository root: the CLI imports `tests.support.work_app` from it


class Cli:
    """Start `bgq --app tests.support.work_app:queue work ...` processes (`app=` names another factory);
    kill whatever is left at close()."""

    def __init__(self, url: str, table: str, ledger: str, logs: Path, stalled: int | None = None) -> None:
        self.url, self.ledger, self.logs = url, ledger, logs
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("BGQ_")}
        self.env.update(BGQ_TEST_WORK_URL=url, BGQ_TEST_WORK_TABLE=table, BGQ_TEST_WORK_LEDGER=ledger)
        if stalled is not None:
            self.env["BGQ_TEST_WORK_STALLED"] = str(stalled)
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str, app: str = "queue") -> subprocess.Popen[bytes]:
        log = (self.logs / f"worker{len(self.procs)}.log").open("wb")
        proc = subprocess.Popen(
            [BGQ, "--app", f"tests.support.work_app:{app}", *args],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: close() reaches forked children too
        )
        log.close()
        self.procs.append(proc)
        return proc

    @property
    def bgq_env(self) -> dict[str, str]:
        """The BGQ_* variables the started processes get (for tests.support.cli.run_bgq)."""
        return bgq_vars(self.env)

    def output(self, proc: subprocess.Popen[bytes]) -> str:
        return (self.logs / f"worker{self.procs.index(proc)}.log").read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        return read_ledger(self.url, self.ledger)

    def wait_ready(self, count: int, timeout: float = 20.0) -> None:
        """Wait until `count` worker processes have loaded the app (and so are about to claim)."""
        wait_until(
            lambda: sum(e["event"] == "ready" for e in self.events()) >= count,
            f"{count} worker(s) to start",
            timeout,
            step=0.1,
        )

    def wait_exit(self, proc: subprocess.Popen[bytes], timeout: float) -> int:
        """Wait for `proc` to exit by itself: its exit code; AssertionError with its output after
        `timeout` seconds."""
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{proc.args} runs after {timeout} s:\n{self.output(proc)}") from None

    def terminate(self, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> tuple[int, float]:
        """SIGTERM, then wait: (exit code, seconds it took)."""
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"bgq work did not exit within {timeout} s of SIGTERM:\n{self.output(proc)}"
            ) from None
        return code, time.monotonic() - started

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
