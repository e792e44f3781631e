"""The Core concurrency proof against `bgq work`: real worker processes on real servers.

Every callback logs 'start' and 'end' to a ledger table (tests/support/work_app.py), each in its own
committed transaction, so the ledger's seq order is the order in which things happened. From it:
every job ran exactly once, no two jobs of one serial group overlapped, and each group started its
jobs in (priority, id) order. A second proof SIGKILLs the worker of a running grouped job.
"""

from __future__ import annotations

import os
import random
import signal
from collections import Counter, defaultdict
from typing import Any

import pytest

from bgq import JobState
from tests.support import work_app
from tests.support.helpers import wait_until
from tests.test_work import cli  # noqa: F401  (the fixture)

GROUPS = 5
GROUPED_JOBS = 240
UNGROUPED_JOBS = 60


def _publish(make_queue, specs: list[tuple[str, str | None, int, str]]) -> dict[str, dict[str, Any]]:
    """Insert every job in one statement (so that workers see them all at once); token -> job."""
    queue = make_queue(
        callbacks={"ledger": work_app.ledger, "slow_once": work_app.slow_once},
        priorities=[1, 2, 3],
        bulk_size=len(specs),
    )
    with queue.bulk() as batch:
        for token, group, priority, callback in specs:
            queue.publish(callback, [token, group], serial_group=group, priority=priority)
    return {
        token: {"id": job_id, "group": group, "priority": priority}
        for (token, group, priority, _), job_id in zip(specs, batch.ids, strict=True)
    }


def _mix(seed: int) -> list[tuple[str, str | None, int, str]]:
    """GROUPED_JOBS over GROUPS groups and UNGROUPED_JOBS, priorities 1-3, in random order."""
    rng = random.Random(seed)
    specs = [
        (f"j{n}", f"g{rng.randrange(GROUPS)}" if n < GROUPED_JOBS else None, rng.choice([1, 2, 3]), "ledger")
        for n in range(GROUPED_JOBS + UNGROUPED_JOBS)
    ]
    rng.shuffle(specs)
    return specs


def _unfinished(installed) -> int:
    return installed.sql("SELECT COUNT(*) AS n FROM {t} WHERE state <> 3")[0]["n"]


def _check_groups(events: list[dict[str, Any]], jobs: dict[str, dict[str, Any]], killed: str | None = None):
    """No overlap inside a group and (priority, id) start order. `killed`: the token whose first
    start has no end (its worker was SIGKILLed): that start must be followed directly by the
    job's own rerun, with nothing of its group in between."""
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["grp"] is not None and e["event"] in ("start", "end"):
            by_group[e["grp"]].append(e)
    assert set(by_group) == {j["group"] for j in jobs.values() if j["group"] is not None}
    for group, seq in by_group.items():
        if killed is not None and jobs[killed]["group"] == group:
            first = next(i for i, e in enumerate(seq) if e["token"] == killed)
            assert seq[first]["event"] == "start"
            assert (seq[first + 1]["token"], seq[first + 1]["event"]) == (killed, "start"), (
                f"{group} moved on while its killed job was not rerun: {seq[first : first + 3]}"
            )
            seq = seq[:first] + seq[first + 1 :]
        for i in range(0, len(seq), 2):
            start, end = seq[i], seq[i + 1] if i + 1 < len(seq) else None
            assert start["event"] == "start" and end is not None, f"{group}: {seq[i : i + 2]}"
            assert (end["token"], end["event"]) == (start["token"], "end"), (
                f"overlap in {group}: {start['token']} and {end['token']}"
            )
        started = [e["token"] for e in seq if e["event"] == "start"]
        expected = sorted(
            (t for t, j in jobs.items() if j["group"] == group),
            key=lambda t: (jobs[t]["priority"], jobs[t]["id"]),
        )
        assert started == expected, f"group {group} did not run in (priority, id) order"


@pytest.mark.parametrize("topology", ["3 processes", "-c 3"])
def test_work_processes_never_overlap_in_a_group_and_run_each_job_once(make_queue, installed, cli, topology):  # noqa: F811
    runner = cli()
    if topology == "3 processes":
        procs = [runner.start("work") for _ in range(3)]
        runner.wait_ready(3)
    else:
        procs = [runner.start("work", "-c", "3")]
        runner.wait_ready(1)
    jobs = _publish(make_queue, _mix(seed=11))
    wait_until(lambda: _unfinished(installed) == 0, "every job to finish", 60, step=0.2)
    for proc in procs:
        code, _ = runner.terminate(proc, timeout=15)
        assert code == 0, runner.output(proc)

    events = [e for e in runner.events() if e["event"] != "ready"]
    starts = Counter(e["token"] for e in events if e["event"] == "start")
    ends = Counter(e["token"] for e in events if e["event"] == "end")
    assert starts == ends == Counter(jobs.keys()), "every job ran exactly once"
    _check_groups(events, jobs)

    rows = {r["id"]: r for r in installed.sql("SELECT id, state, number_of_attempts, pid FROM {t}")}
    assert len(rows) == len(jobs)
    ran_by = {e["token"]: e["pid"] for e in events if e["event"] == "start"}
    for token, job in jobs.items():
        row = rows[job["id"]]
        assert (row["state"], row["number_of_attempts"]) == (JobState.FINISHED, 1), row
        assert row["pid"] == ran_by[token], "the pid column names the process that ran the job"
    worker_pids = set(ran_by.values())
    assert len(worker_pids) >= 2, f"the jobs were shared between processes: {Counter(ran_by.values())}"
    if topology == "3 processes":
        assert worker_pids <= {p.pid for p in procs}
    else:
        assert procs[0].pid not in worker_pids, "-c 3: the parent only supervises its 3 children"


def test_a_sigkilled_worker_s_job_runs_again_only_after_reaping(make_queue, installed, cli):  # noqa: F811
    """Two workers; the one running the slow grouped job is SIGKILLed inside it. The group waits
    (its job stays PROCESSING) while the other groups go on; the reaper (queue.process(), with
    stalled_job_timeout 3 s) releases it, and the surviving worker reruns it and finishes the group
    in order."""
    stalled = 3
    runner = cli(stalled=stalled)
    rng = random.Random(5)
    specs = [(f"j{n}", f"g{n % 3}" if n < 36 else None, rng.choice([1, 2, 3]), "ledger") for n in range(48)]
    rng.shuffle(specs)
    specs.append(("slow", "g0", 2, "slow_once"))
    specs += [(f"k{n}", "g0", 3, "ledger") for n in range(5)]  # behind the slow job in g0
    jobs = _publish(make_queue, specs)
    procs = {p.pid: p for p in (runner.start("work"), runner.start("work"))}

    first = wait_until(
        lambda: next((e for e in runner.events() if e["token"] == "slow"), None), "the slow job to start", 20
    )
    victim = first["pid"]
    assert victim in procs
    os.kill(victim, signal.SIGKILL)
    procs[victim].wait(10)
    (survivor,) = set(procs) - {victim}

    reaper = make_queue(
        callbacks={"ledger": work_app.ledger, "slow_once": work_app.slow_once},
        priorities=[1, 2, 3],
        stalled_job_timeout=stalled,
    )
    slow_id = jobs["slow"]["id"]

    def released() -> bool:
        row = installed.sql("SELECT state, pid FROM {t} WHERE id = %s", (slow_id,))[0]
        if row["state"] != JobState.PROCESSING:
            return True
        assert row["pid"] == victim
        work_app.write("reap", "-")  # the ledger's mark: what follows may come after this reap
        reaper.process()
        return False

    wait_until(released, "the reaper to release the killed job", 20, 0.3)
    reaped = installed.sql("SELECT id, pid, state FROM {t} WHERE error_message LIKE 'Job was stalled%%'")
    assert slow_id in {r["id"] for r in reaped}
    assert all(r["pid"] == victim for r in reaped), "only the dead worker's jobs were reaped"
    # The reaped jobs got a backoff (a minute); let it have passed.
    for r in reaped:
        installed.sql("UPDATE {t} SET postponed_by = 0 WHERE id = %s AND state = 4", (r["id"],))

    wait_until(lambda: _unfinished(installed) == 0, "every job to finish", 20, step=0.2)
    code, _ = runner.terminate(procs[survivor], timeout=15)
    assert code == 0, runner.output(procs[survivor])

    events = runner.events()
    last_reap = max(e["seq"] for e in events if e["event"] == "reap")
    slow_starts = [e for e in events if e["token"] == "slow" and e["event"] == "start"]
    assert len(slow_starts) == 2 and slow_starts[0]["pid"] == victim
    assert slow_starts[1]["seq"] > last_reap, "the killed job ran again before the reaper released it"
    work = [e for e in events if e["event"] in ("start", "end")]
    starts = Counter(e["token"] for e in work if e["event"] == "start")
    ends = Counter(e["token"] for e in work if e["event"] == "end")
    assert ends == Counter(jobs.keys()), "every job finished exactly once"
    assert starts == ends + Counter(["slow"]), "only the killed job started twice"
    for r in reaped:
        token = next(t for t, j in jobs.items() if j["id"] == r["id"])
        again = [e for e in work if e["token"] == token and e["event"] == "start" and e["pid"] != victim]
        assert again and all(e["seq"] > last_reap for e in again), f"{token} ran before it was reaped"
    _check_groups(work, jobs, killed="slow")
    states = installed.sql("SELECT state, COUNT(*) AS n FROM {t} GROUP BY state")
    assert [(s["state"], s["n"]) for s in states] == [(JobState.FINISHED, len(jobs))]


@pytest.mark.parametrize("dialect", ["postgres"], indirect=True)
def test_postgres_idle_workers_each_take_a_group_of_a_burst_at_once(make_queue, installed, cli, dialect):  # noqa: F811
    """Three idle workers (--poll 10, so only NOTIFY wakes them early) and three groups of 15 jobs
    of 0.1 s published in one statement: the insert's NOTIFY wakes all three, and as different
    groups never block each other, each worker takes a group and the three run side by side
    (about 1.5 s), rather than one after another on one worker (about 4.5 s)."""
    runner = cli()
    procs = [runner.start("work", "--poll", "10") for _ in range(3)]
    runner.wait_ready(3)
    listening = "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE state = 'idle' AND query = %s"
    channel = (f'LISTEN "{installed.table}"',)
    wait_until(
        lambda: installed.sql(listening, channel)[0]["n"] >= 3, "all three idle, waiting on LISTEN", 20, 0.05
    )
    specs = [(f"g{g}-{n}", f"g{g}", 1, "ledger") for n in range(15) for g in range(3)]
    queue = make_queue(callbacks={"ledger": work_app.ledger}, priorities=[1, 2, 3], bulk_size=len(specs))
    with queue.bulk():
        for token, group, priority, callback in specs:
            queue.publish(callback, [token, group, 0.1], serial_group=group, priority=priority)
    wait_until(lambda: _unfinished(installed) == 0, "every job to finish", 30, step=0.2)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    installed.sql("NOTIFY {t}")  # idle workers see SIGTERM at their next wake-up
    for proc in procs:
        assert proc.wait(15) == 0, runner.output(proc)

    spans = {}
    for group in ("g0", "g1", "g2"):
        mine = [e for e in runner.events() if e["grp"] == group]
        spans[group] = (mine[0]["at"], mine[-1]["at"], {e["pid"] for e in mine})
    assert max(s[0] for s in spans.values()) < min(s[1] for s in spans.values()), (
        f"the groups did not run side by side: {spans}"
    )
    assert len(set().union(*(s[2] for s in spans.values()))) == 3, f"three workers took a group each: {spans}"
