"""Cron mode (`bgq process`) at production backlogs: every run makes progress, in group order.

A run claims what `{table}_claim_batch` would give a worker (ungrouped due jobs and the heads of
idle groups), so no window of blocked rows can hide the runnable ones; the per-run limit counts
jobs claimed. Proven in one process on a backlog of 100,000 due jobs, and with several real
`bgq process` processes ("hosts" with their own lock directories) judged by the callbacks' ledger.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from typing import Any

import pytest

from bgq import JobState
from bgq.modes.process import PROCESS_LIMIT
from tests.support import work_app
from tests.support.helpers import wait_until
from tests.test_work import cli  # noqa: F401  (the fixture)


def _bulk(queue, specs: list[tuple[str | None, int]], callback: str = "ran") -> list[int]:
    """Publish (group, priority) jobs in one transaction; their ids in order."""
    ids: list[int] = []
    step = 5000
    for start in range(0, len(specs), step):
        with queue.bulk() as batch:
            for n, (group, priority) in enumerate(specs[start : start + step], start):
                queue.publish(callback, [n], serial_group=group, priority=priority)
        ids.extend(batch.ids)
    return ids


def _state_counts(installed) -> dict[int, int]:
    rows = installed.sql("SELECT state, COUNT(*) AS n FROM {t} GROUP BY state")
    return {r["state"]: r["n"] for r in rows}


def test_a_backlog_below_the_head_does_not_starve_the_head_or_other_jobs(make_queue, installed):
    """1,000 jobs at priority 2 in one group, then its priority-1 head, then an ungrouped job:
    the first run starts with the head and runs the ungrouped job; two runs finish everything."""
    ran: list[int] = []
    queue = make_queue(callbacks={"ran": ran.append}, priorities=[1, 2], bulk_size=5000)
    specs = [("g", 2)] * 1000 + [("g", 1), (None, 1)]
    ids = _bulk(queue, specs)
    assert len(ids) == len(specs)
    head, ungrouped = 1000, 1001  # a job's parameter is its index in specs

    first = queue.process()
    assert first.outcomes == {"claimed": PROCESS_LIMIT}, first.outcomes
    assert head in ran and ungrouped in ran
    grouped = [n for n in ran if n != ungrouped]
    assert grouped[0] == head
    assert grouped[1:] == list(range(len(grouped) - 1)), "the group's jobs run in (priority, id) order"

    second = queue.process()
    assert second.outcomes == {"claimed": len(specs) - PROCESS_LIMIT}
    assert _state_counts(installed) == {int(JobState.FINISHED): len(specs)}
    assert sorted(ran) == list(range(len(specs)))


def test_an_empty_queue_is_a_run_that_does_nothing(make_queue, installed):
    queue = make_queue()
    report = queue.process()
    assert report.outcomes == {} and report.reaped == 0


@pytest.mark.slow
def test_every_run_makes_progress_on_100000_due_jobs_in_1000_groups(make_queue, installed):
    """Each run claims PROCESS_LIMIT jobs, and each one it runs is its group's next job."""
    rng = random.Random(9)
    specs = [
        (None if n % 10 == 0 else f"g{rng.randrange(1000)}", rng.choice([1, 2, 3])) for n in range(100_000)
    ]
    ran: list[int] = []
    queue = make_queue(callbacks={"ran": ran.append}, priorities=[1, 2, 3], bulk_size=5000)
    _bulk(queue, specs)
    order: dict[str, list[int]] = defaultdict(list)  # each group's jobs in (priority, id) order
    for n, (group, _priority) in sorted(enumerate(specs), key=lambda e: (e[1][1], e[0])):
        if group is not None:
            order[group].append(n)

    for run in range(2):
        before = len(ran)
        started = time.monotonic()
        report = queue.process()
        seconds = time.monotonic() - started
        assert report.outcomes == {"claimed": PROCESS_LIMIT}, (run, report.outcomes)
        assert len(ran) - before == PROCESS_LIMIT
        print(f"run {run}: {PROCESS_LIMIT} jobs in {seconds:.1f} s")
    per_group: dict[str, list[int]] = defaultdict(list)
    for n in ran:
        group = specs[n][0]
        if group is not None:
            per_group[group].append(n)
    for group, done in per_group.items():
        assert done == order[group][: len(done)], f"group {group} ran out of order"
    assert len(ran) == len(set(ran))


def _hosts(runner, hosts: int, tmp_path, deadline: float, done) -> int:
    """Keep one `bgq process` running per host (own lock directory) until `done()`; runs started."""
    envs = []
    for n in range(hosts):
        locks = tmp_path / f"host{n}"
        locks.mkdir()
        envs.append({**runner.env, "BGQ_LOCKS_DIR": str(locks)})
    running: list[Any] = [None] * hosts
    runs = 0
    base_env = runner.env

    def finished() -> bool:  # else: a new run on every host whose run ended
        nonlocal runs
        if done():
            return True
        for n in range(hosts):
            if running[n] is None or running[n].poll() is not None:
                if running[n] is not None:
                    assert running[n].returncode == 0, runner.output(running[n])
                runner.env = envs[n]
                running[n] = runner.start("process")
                runs += 1
        return False

    try:
        wait_until(
            finished, "the cron runs to finish the backlog", max(0.0, deadline - time.monotonic()), 0.05
        )
    finally:
        runner.env = base_env
    return runs


@pytest.mark.slow
def test_four_cron_hosts_finish_5000_jobs_in_50_groups_in_order(make_queue, installed, cli, tmp_path):  # noqa: F811
    """At the scale where cron mode used to leave 9 jobs in 10 unrun: all finish, exactly once,
    no two jobs of a group overlap, and each group starts its jobs in (priority, id) order."""
    rng = random.Random(5)
    specs = [(f"g{rng.randrange(50)}", rng.choice([1, 2, 3])) for _ in range(5000)]
    queue = make_queue(callbacks={"ledger": work_app.ledger}, priorities=[1, 2, 3], bulk_size=5000)
    with queue.bulk() as batch:
        for n, (group, priority) in enumerate(specs):
            queue.publish("ledger", [f"j{n}", group], serial_group=group, priority=priority)
    runner = cli()
    started = time.monotonic()
    unfinished = lambda: installed.sql("SELECT COUNT(*) AS n FROM {t} WHERE state <> 3")[0]["n"]  # noqa: E731
    runs = _hosts(runner, 4, tmp_path, started + 240, lambda: unfinished() == 0)
    seconds = time.monotonic() - started
    print(f"5000 jobs, 4 cron hosts: {seconds:.1f} s, {5000 / seconds:.0f} jobs/s, {runs} runs")
    wait_until(lambda: all(p.poll() is not None for p in runner.procs), "the last runs to exit", 30)

    events = [e for e in runner.events() if e["event"] in ("start", "end")]
    starts = [e["token"] for e in events if e["event"] == "start"]
    assert sorted(starts) == sorted(f"j{n}" for n in range(len(specs))), "every job ran exactly once"
    open_in: dict[str, str] = {}
    first_starts: dict[str, list[int]] = defaultdict(list)
    for e in events:  # seq order is commit order
        if e["event"] == "start":
            assert e["grp"] not in open_in, f"two jobs of {e['grp']} overlapped"
            open_in[e["grp"]] = e["token"]
            first_starts[e["grp"]].append(int(e["token"][1:]))
        else:
            assert open_in.pop(e["grp"]) == e["token"]
    for group, started_order in first_starts.items():
        expected = sorted(started_order, key=lambda n: (specs[n][1], batch.ids[n]))
        assert started_order == expected, f"group {group} ran out of (priority, id) order"
