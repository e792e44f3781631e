"""A hung `bgq process` (SIGSTOP) keeps its host's lock: the runs it refuses and `bgq monitor` say so
at CRITICAL with its pid and age, and `--max-runtime` ends a long run, with real processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from bgq import JobState, Queue
from bgq.cli.commands import queue_lock_name
from tests.support.cli import BGQ, bgq_vars, run_bgq
from tests.support.helpers import unique_name, wait_until


def slow_app(tmp_path: Path, installed) -> str:
    """An app whose callback `slow(name, seconds)` writes its start time to MARKS/name, then sleeps."""
    module = unique_name("bgqslow")
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            f"""
            import time
            from pathlib import Path

            import bgq

            MARKS = Path({str(tmp_path)!r})


            def slow(name, seconds):
                (MARKS / f"{{name}}.started").write_text(repr(time.time()))
                time.sleep(seconds)  # real: the job's run time in a `bgq process` child


            queue = bgq.Queue(
                callbacks={{"slow": slow}},
                database_url={installed.url!r},
                table_name={installed.table!r},
                queue="general",
            )
            """
        )
    )
    return module


class Runs:
    """`bgq --app <slow app>:queue ...` on the test's table, with a locks dir of the test's own."""

    def __init__(self, tmp_path: Path, installed) -> None:
        self.tmp_path = tmp_path
        self.module = slow_app(tmp_path, installed)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("BGQ_")}
        self.env.update(
            BGQ_LOCKS_DIR=str(tmp_path / "locks"),
            PYTHONPATH=os.pathsep.join([str(tmp_path), self.env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        )
        self.procs: list[subprocess.Popen[str]] = []

    def argv(self, *args: str) -> list[str]:
        return [BGQ, "--app", f"{self.module}:queue", *args]

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120):
        return run_bgq(
            "--app", f"{self.module}:queue", *args, env=bgq_vars({**self.env, **(env or {})}),
            pythonpath=self.tmp_path, timeout=timeout,
        )  # fmt: skip

    def start(self, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            self.argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env
        )
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.communicate(timeout=30)


@pytest.fixture
def runs(tmp_path, installed):
    target = Runs(tmp_path, installed)
    yield target
    target.close()


def publish_slow(make_queue, *jobs: tuple[str, float]) -> list[int]:
    queue = make_queue(callbacks={"slow": lambda name, seconds: None}, bulk_size=max(len(jobs), 1))
    with queue.bulk() as batch:
        for name, seconds in jobs:
            queue.publish("slow", [name, seconds])
    return batch.ids


def lock_age(runs: Runs, installed) -> float:
    """The age the holder recorded in the `bgq process` lock file (0 until it has written it)."""
    queue = Queue(callbacks={"slow": lambda name, seconds: None}, database_url=installed.url,
                  table_name=installed.table, queue="general")  # fmt: skip
    path = runs.tmp_path / "locks" / f"{queue_lock_name('process', queue)}.lock"
    fields = path.read_text().split() if path.exists() else []
    return time.time() - float(fields[1]) if len(fields) > 1 else 0.0


def test_a_stopped_process_run_is_reported_at_critical_with_its_pid_and_age(runs, make_queue, installed):
    (held,) = publish_slow(make_queue, ("hold", 120.0))
    holder = runs.start("process")
    wait_until(lambda: (runs.tmp_path / "hold.started").exists(), "the first run to start its job", 60)
    os.kill(holder.pid, signal.SIGSTOP)  # hung: alive, holding the lock, doing nothing

    young = runs.run("process", env={"BGQ_STALE_AFTER": "3600"})
    assert young.returncode == 0, young.stderr
    assert "is already running on this host; exiting." in young.stderr
    assert "CRITICAL" not in young.stderr  # held, but not for long: a normal overlap

    wait_until(lambda: lock_age(runs, installed) > 1.5, "the lock to be older than the bound", 30)
    refused = runs.run("process", env={"BGQ_STALE_AFTER": "1"})
    assert refused.returncode == 0, refused.stderr
    assert refused.stdout == ""
    critical = [line for line in refused.stderr.splitlines() if line.startswith("CRITICAL ")]
    assert len(critical) == 1, refused.stderr
    assert f"held by pid {holder.pid} for " in critical[0]
    age = int(critical[0].split(" for ")[1].split(" s ")[0])
    assert age >= 1
    assert "is already running on this host; exiting." in refused.stderr

    monitor = runs.run("monitor", "--stale-after", "1")
    assert monitor.returncode == 0, monitor.stderr
    assert monitor.stdout.splitlines()[-1].startswith("bgq process: HUNG for ")
    assert monitor.stdout.splitlines()[-1].endswith(f" s (pid {holder.pid})")
    assert f"(pid {holder.pid}, over 1 s): it is hung" in monitor.stderr
    report = json.loads(runs.run("monitor", "--json", "--stale-after", "1").stdout)["process_lock"]
    assert report["pid"] == holder.pid and report["stale"] is True and report["age_s"] >= 1

    calm = runs.run("monitor", "--json", "--stale-after", "3600")
    assert json.loads(calm.stdout)["process_lock"]["stale"] is False
    assert "CRITICAL" not in calm.stderr
    assert installed.sql("SELECT state FROM {t} WHERE id = %s", (held,))[0]["state"] == JobState.PROCESSING


def test_monitor_reports_no_process_lock_when_none_is_held(runs):
    result = runs.run("monitor", "--json", "--stale-after", "0")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["process_lock"] is None


@pytest.mark.slow
def test_max_runtime_stops_a_long_run_within_the_limit_plus_one_job(runs, make_queue, installed):
    # The limit counts from the start of process(), connecting and registering included: 4 s
    # leaves room for a loaded machine (xdist workers beside it) to start a job before it is up.
    limit, seconds = 4.0, 0.5
    ids = publish_slow(make_queue, *((f"j{n}", seconds) for n in range(40)))  # 20 s of work
    started = time.monotonic()
    result = runs.run("process", "--max-runtime", str(limit))
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith(f"; stopped at --max-runtime {limit:g} s"), result.stdout
    starts = sorted(float(p.read_text()) for p in runs.tmp_path.glob("j*.started"))
    assert 1 <= len(starts) < len(ids)
    assert starts[-1] - starts[0] < limit, "a job was started after --max-runtime"
    states = [r["state"] for r in installed.sql("SELECT state FROM {t} ORDER BY id")]
    assert states.count(JobState.FINISHED) == len(starts)
    assert states.count(JobState.READY) == len(ids) - len(starts)  # left for the next run
    assert took < limit + seconds + 30, f"the run took {took:.1f} s"  # 30 s: interpreter start-up


def test_process_with_no_time_left_starts_no_job(make_queue, installed):
    queue = make_queue(callbacks={"slow": lambda name, seconds: None})
    job_id = queue.publish("slow", ["x", 0])
    report = queue.process(max_runtime=0)
    assert report.timed_out and report.outcomes == {}
    assert installed.sql("SELECT state FROM {t} WHERE id = %s", (job_id,))[0]["state"] == JobState.READY
    assert not queue.process(max_runtime=60).timed_out
    assert installed.sql("SELECT state FROM {t} WHERE id = %s", (job_id,))[0]["state"] == JobState.FINISHED
