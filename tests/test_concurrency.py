"""Mutual exclusion, order and exactly-once, proven with real OS processes on real servers."""

from __future__ import annotations

import multiprocessing
import random
from collections import defaultdict

import pytest

from tests.support import ledger_worker

WORKERS = 4
GROUPS = 5
GROUPED_JOBS = 240
UNGROUPED_JOBS = 40


def _publish_mix(queue, seed: int) -> dict[str, tuple[int, str | None, int]]:
    """Publish a few hundred jobs over a few groups, mixed priorities; token -> (id, group, prio)."""
    rng = random.Random(seed)
    jobs = {}
    for n in range(GROUPED_JOBS + UNGROUPED_JOBS):
        group = f"g{rng.randrange(GROUPS)}" if n < GROUPED_JOBS else None
        priority = rng.choice([1, 2, 3])
        token = f"j{n}"
        job_id = queue.publish("ledger", [token, group], serial_group=group, priority=priority)
        jobs[token] = (job_id, group, priority)
    return jobs


@pytest.mark.slow
def test_processes_never_overlap_inside_a_group_and_run_in_priority_order(make_queue, installed, ledger):
    """Checklist 53/54: >= 4 processes call process_job concurrently; the ledger proves no two jobs
    of a group overlap, every job ran exactly once, and each group started in (priority, id) order."""
    queue = make_queue(callbacks={"ledger": ledger_worker.ledger_job}, priorities=[1, 2, 3])
    jobs = _publish_mix(queue, seed=7)
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(
            target=ledger_worker.run_until_done,
            args=(installed.url, installed.table, ledger, seed, 150.0),
        )
        for seed in range(WORKERS)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(200)
        assert p.exitcode == 0
    events = ledger_worker.read_ledger(installed.url, ledger)

    starts = defaultdict(int)
    for _, token, _, event in events:
        if event == "start":
            starts[token] += 1
    assert set(starts) == set(jobs), "every job ran"
    assert all(count == 1 for count in starts.values()), "no job ran twice"

    by_group: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for _, token, group, event in events:
        if group is not None:
            by_group[group].append((event, token))
    for group, seq in by_group.items():
        # A group's events must alternate start(x), end(x), start(y), end(y), ...: no overlap.
        for i in range(0, len(seq), 2):
            assert seq[i][0] == "start" and seq[i + 1] == ("end", seq[i][1]), (
                f"overlap in {group}: {seq[i : i + 3]}"
            )
        started = [token for event, token in seq if event == "start"]
        expected = sorted(
            (t for t, (_, g, _) in jobs.items() if g == group), key=lambda t: (jobs[t][2], jobs[t][0])
        )
        assert started == expected, f"group {group} did not run in (priority, id) order"


def test_same_id_handed_to_two_processes_runs_once(make_queue, installed, ledger):
    """Checklist 86 / invariant 3: two processes call process_job(id) at the same instant: one run."""
    queue = make_queue(callbacks={"ledger": ledger_worker.ledger_job}, priorities=[1, 2, 3])
    ids = [
        queue.publish("ledger", [f"r{n}", "g" if n % 2 else None], serial_group="g" if n % 2 else None)
        for n in range(20)
    ]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=ledger_worker.race_one,
            args=(installed.url, installed.table, ledger, ids, barrier, results),
        )
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    outcomes = defaultdict(list)
    for _ in range(2 * len(ids)):
        job_id, outcome = results.get(timeout=120)
        outcomes[job_id].append(outcome)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    events = ledger_worker.read_ledger(installed.url, ledger)
    starts = defaultdict(int)
    for _, token, _, event in events:
        if event == "start":
            starts[token] += 1
    assert starts == {f"r{n}": 1 for n in range(20)}
    for job_id, pair in outcomes.items():
        assert sorted(pair)[0] == "claimed" and pair.count("claimed") == 1, (job_id, pair)
