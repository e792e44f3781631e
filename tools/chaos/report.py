"""The chaos harness's output: one table row per run, evidence per violation kind, docs/reliability.md."""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path

from tools.chaos.oracle import Recovery, Verdict

HEADER = (
    "| mode | dialect | jobs | groups | faults kill/stop/db/mq | wall s | jobs/s | overlaps | order "
    "| lost | unexplained re-runs | classified re-runs | zombie tails | row mismatches | stuck | drain s "
    "| max gap s |"
)
STATE_NAMES = {-99: "missing", -1: "BACK_TO_BROKER", 1: "READY", 2: "PROCESSING", 4: "TEMPORARILY_FAILED",
               5: "PERMANENTLY_FAILED", 6: "WAITING", 7: "REDUNDANT", 8: "BROKER_FAILED"}  # fmt: skip


@dataclass
class RunResult:
    mode: str
    dialect: str
    jobs: int
    groups: int
    seed: int
    faults: dict[str, int]
    wall_s: float
    verdict: Verdict
    notes: dict[str, int] = field(default_factory=dict)  # log-line counts (CRITICAL, already running…)
    kept: str | None = None  # the run directory, when kept for inspection
    topology: str | None = None  # the `make scale` topology it ran on (None: the single server)
    recovery: list[Recovery] = field(default_factory=list)  # per topology fault
    faults_on: bool = True  # False: a fault-free run, for its throughput

    @property
    def unexercised(self) -> bool:
        """No fault reached this run (it drained before the first one): it proves nothing. On a
        topology, its own fault must have struck."""
        if not self.faults_on:
            return False
        if self.topology is not None:
            return not self.recovery
        return not any(self.faults.values())

    @property
    def rate(self) -> float:
        """Jobs completed per second of the run."""
        return self.verdict.completed / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def failed(self) -> bool:
        return self.verdict.failed or self.unexercised

    def row(self) -> str:
        v, f = self.verdict, self.faults
        faults = "/".join(str(f.get(k, 0)) for k in ("kill", "stop", "dbkill", "broker_stop"))
        rate = self.rate
        stuck = str(v.stuck)
        if v.stuck:
            stuck += (
                " ("
                + ", ".join(f"{STATE_NAMES.get(s, s)} {n}" for s, n in sorted(v.stuck_states.items()))
                + ")"
            )
        drain = "not drained" if v.drain_s is None else f"{v.drain_s:.1f}"
        cells = [
            self.mode, self.dialect, str(self.jobs), str(self.groups), faults, f"{self.wall_s:.1f}",
            f"{rate:.0f}", str(v.overlaps), str(v.order_violations), str(v.lost), str(v.unexplained_reruns),
            str(v.classified_reruns), str(v.zombie_tails), str(v.row_mismatches + v.malformed), stuck, drain,
            f"{v.max_gap_s:.1f} at {v.max_gap_at_s:.0f}",
        ]  # fmt: skip
        return "| " + " | ".join(cells) + " |"

    def details(self, where: bool = True) -> list[str]:
        """Evidence lines; `where`: name the kept run directory (not in the doc: it is this host's)."""
        v = self.verdict
        out = [f"- **{self.mode} / {self.dialect}** (seed {self.seed}): {v.executions} executions of "
               f"{v.published} jobs, {v.completed} completed."]  # fmt: skip
        if self.unexercised:
            out.append("  FAILED: no fault was injected before the run drained (make the run larger).")
        if v.rerun_classes:
            out.append(
                "  Re-runs by cause: "
                + ", ".join(f"{k} {n}" for k, n in sorted(v.rerun_classes.items()))
                + "."
            )
        if self.notes:
            out.append(
                "  Worker logs: " + ", ".join(f"{k}: {n}" for k, n in sorted(self.notes.items())) + "."
            )
        for kind, lines in sorted(v.evidence.items()):
            for line in lines:
                out.append(f"  - {kind}: {line}")
        if self.kept and where:
            out.append(f"  Ledger, fault log and worker logs kept in `{self.kept}`.")
        return out


def table(results: list[RunResult]) -> str:
    sep = "|" + "|".join("---" for _ in HEADER.strip("|").split("|")) + "|"
    return "\n".join([HEADER, sep, *(r.row() for r in results)])


def text(results: list[RunResult]) -> str:
    lines = [table(results), ""]
    for r in results:
        lines.extend(r.details())
    return "\n".join(lines)


METHOD = """\
## How a run works

`tools/chaos/run.py` creates a database of its own (`bgqchaos_<hex>`) on the dialect's server, runs
`bgq install-procs` through the CLI, publishes every job (bulk publish) and records the published
`(id, group, priority)` list itself, and only then starts real worker processes through the `bgq`
CLI: `bgq process` started like cron on several hosts (each its own `BGQ_LOCKS_DIR`), `bgq work`
(one of them `bgq work -c 2`), `bgq consume` with a cron host beside it (broker mode, on RabbitMQ
queues named after the run), or `bgq work` and cron hosts on one queue (mixed). Continuous workers
that exit are started again, as a supervisor would. Faults follow a seeded schedule that is printed
before the run:

- **kill**: SIGKILL of a random process that runs callbacks (a `bgq work -c 2` child, a `bgq work`,
  a `bgq consume`, a running `bgq process`), at any instant, inside bgq's transactions included;
- **stop**: SIGSTOP of a random worker for `stalled_job_timeout` + 3 s, then SIGCONT;
- **db**: every session of the run's database killed (MariaDB: `KILL` of each id of
  `information_schema.PROCESSLIST` with `DB` = the run's database; PostgreSQL:
  `pg_terminate_backend` over `pg_stat_activity` with `datname` = the run's database);
- **mq** (broker mode): `rabbitmqctl stop_app`, a pause, `rabbitmqctl start_app`.

Faults stop some seconds before the run's bound so that the tail can drain; the run ends when bgq's
table says every job is FINISHED, or at `--seconds`. Then every worker gets SIGTERM (SIGKILL after a
grace period), the end state of bgq's table is read, and the database and broker queues are dropped
(also after a failure or Ctrl-C).

The app (`tools/chaos/app.py`) runs with `stalled_job_timeout` 8 s, `stalled_job_backoff` 0 (a
reaped job may run again at once), `lock_timeout` 2 s (a frozen session is cut after 2 s idle in
its transaction, and nobody waits longer for its locks), `heartbeat_interval` 1 s and priorities
1-3 (`lost_message_timeout`: 15 s in the ci preset, 60 s in the full one). Its
callback sleeps 1-5 ms between two lines it appends to a ledger file of its own process
(`token start|end pid monotonic_ns wall`, one `write(2)` on an `O_APPEND` file): the ledger is not
bgq's table. The oracle (`tools/chaos/oracle.py`, unit-tested in
`tests/test_chaos_oracle.py`) judges each run from that ledger, the published list and the harness's
fault log:

- **overlaps**: two executions of one serial group (or of one ungrouped job) that overlap in time.
  An execution lasts from its start to its end, or to the SIGKILL of its process; time its process
  spent frozen is taken out. An overlap inside the resumed tail of a frozen execution whose job was
  reaped and re-run is a **zombie tail**, listed apart (the callback of a frozen worker cannot be
  stopped by a queue; bgq fences its result instead);
- **order**: per group, the first starts must follow (priority, id) over the published jobs;
- **lost**: published, never completed;
- **re-runs**: a second run of a job is **classified** only when an earlier run's process was
  killed or frozen after that run started and at most 5 s after its end (before its result could be
  written), or when it started at most 5 ms after its own process was resumed from a freeze (a
  **zombie start**, counted with the zombie tails: the process decided to run the job before it
  froze; the 5 ms are a judgement, and a zombie start's result in the row is still a row mismatch);
  every other second run or second completion is **unexplained**;
- **row mismatches**: for a re-run job, the row (state, attempts, finished_at, pid) must be the
  last run's (the one before a zombie start), not a zombie's late result; plus unreadable ledger
  lines;
- **stuck**: rows of bgq's table that are not FINISHED at the end, by state (read only for this
  end-state snapshot), and **drain s**: how long after the last fault the last job ended;
- **max gap s**: the longest time without any job ending anywhere (at: seconds after the first
  start), the figure of a worker that blocks every other (not a failure by itself).

The harness exits 1 on any overlap, order violation, lost job, unexplained re-run, row mismatch or
stuck job. Zombie tails and classified re-runs are reported, not failures.
"""


def write_doc(
    path: Path, results: list[RunResult], versions: list[str], command: str, preset: str, took: float
) -> None:
    today = dt.date.today().isoformat()
    failed = [r for r in results if r.failed]
    verdict = (
        "Every run passed: no overlap, no order violation, nothing lost, no unexplained re-run, "
        "nothing stuck."
        if not failed
        else f"{len(failed)} of {len(results)} runs FAILED (see the table and the evidence below)."
    )
    body = f"""# bgq reliability: `make chaos`

bgq's fault-injection harness runs real worker processes against a real database, kills them,
freezes them, cuts their database sessions and restarts the broker, and judges what happened from
a ledger the callbacks write themselves. This page holds one run of the harness; `make chaos`
(the full preset) rewrites it.

## The run

- Date: {today}; preset `{preset}`; {took / 60:.1f} minutes in total.
- Versions: {", ".join(versions)}.
- Machine: {os.cpu_count()} cores.
- Command: `{command}`

{verdict}

{table(results)}

faults kill/stop/db/mq: SIGKILLs, SIGSTOPs, cuts of every database session, RabbitMQ restarts.

## Evidence

""" + "\n".join(line for r in results for line in r.details(where=False)) + "\n\n" + METHOD  # fmt: skip
    path.write_text(body)
