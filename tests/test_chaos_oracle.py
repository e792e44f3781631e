"""Unit tests of the chaos oracle (tools/chaos/oracle.py): each kind of violation in a known-bad ledger
is caught, a good ledger passes, and frozen spans, kills and zombie tails are classified as designed."""

from __future__ import annotations

import json

import pytest

from tools.chaos import app, oracle, report
from tools.chaos.oracle import Event, Fault, Job, Row

S = 1_000_000_000  # one second in ns
WALL0 = 1_800_000_000.0


def ev(token: int, event: str, pid: int, at: float) -> Event:
    """An event at `at` seconds (monotonic ns = at * S, wall = WALL0 + at)."""
    return Event(token, event, pid, int(at * S), WALL0 + at, f"{pid}-0.ledger")


def run(token: int, pid: int, start: float, end: float | None) -> list[Event]:
    out = [ev(token, "start", pid, start)]
    if end is not None:
        out.append(ev(token, "end", pid, end))
    return out


def fault(kind: str, at: float, pid: int | None = None, detail: str = "") -> Fault:
    return Fault(kind, int(at * S), WALL0 + at, pid, detail)


def done(job_id: int, pid: int, finished: float, attempts: int = 1) -> Row:
    return Row(job_id, oracle.FINISHED, attempts, WALL0 + finished + 0.001, pid)


GROUP = [Job(1, 0, "g", 1), Job(2, 1, "g", 1), Job(3, 2, "g", 2)]  # order: 1, 2, 3
FREE = Job(4, 3, None, 1)


def good_ledger() -> tuple[list[Event], dict[int, Row]]:
    events = run(0, 100, 1.0, 1.1) + run(1, 101, 1.2, 1.3) + run(2, 100, 1.4, 1.5) + run(3, 102, 1.0, 1.6)
    rows = {1: done(1, 100, 1.1), 2: done(2, 101, 1.3), 3: done(3, 100, 1.5), 4: done(4, 102, 1.6)}
    return events, rows


def test_a_good_ledger_passes() -> None:
    events, rows = good_ledger()
    verdict = oracle.judge([*GROUP, FREE], events, [fault("kill", 0.5, 999)], rows)
    assert not verdict.failed, verdict.evidence
    assert (verdict.completed, verdict.executions, verdict.overlaps, verdict.order_violations) == (4, 4, 0, 0)
    assert verdict.drain_s == pytest.approx(1.1)  # last end 1.6 s, last fault 0.5 s
    assert (verdict.max_gap_s, verdict.max_gap_at_s) == (pytest.approx(0.2), pytest.approx(0.1))


def test_a_clean_run_that_no_fault_reached_fails() -> None:
    """A run that drained before its first fault proves nothing, so the harness counts it failed."""
    events, rows = good_ledger()
    verdict = oracle.judge([*GROUP, FREE], events, [], rows)
    assert not verdict.failed
    quiet = report.RunResult("work", "mysql", 4, 1, 1, {}, 1.6, verdict)
    faulted = report.RunResult("work", "mysql", 4, 1, 1, {"kill": 1, "stop": 0}, 1.6, verdict)
    assert quiet.failed and quiet.unexercised and "no fault was injected" in "\n".join(quiet.details())
    assert not faulted.failed


def test_overlap_of_two_jobs_of_one_group_is_a_violation() -> None:
    events = run(0, 100, 1.0, 2.0) + run(1, 101, 1.5, 2.5) + run(2, 100, 3.0, 3.1)
    rows = {1: done(1, 100, 2.0), 2: done(2, 101, 2.5), 3: done(3, 100, 3.1)}
    verdict = oracle.judge(GROUP, events, [], rows)
    assert verdict.overlaps == 1 and verdict.failed
    assert "overlap" in verdict.evidence


def test_two_ungrouped_jobs_may_overlap_but_one_job_may_not_run_twice_at_once() -> None:
    other = Job(5, 4, None, 1)
    events = run(3, 100, 1.0, 2.0) + run(4, 101, 1.5, 2.5)
    verdict = oracle.judge([FREE, other], events, [], {4: done(4, 100, 2.0), 5: done(5, 101, 2.5)})
    assert not verdict.failed
    twice = run(3, 100, 1.0, 2.0) + run(3, 101, 1.5, 2.5)
    verdict = oracle.judge([FREE], twice, [], {4: done(4, 101, 2.5, attempts=2)})
    assert verdict.overlaps == 1 and verdict.unexplained_reruns == 1 and verdict.failed


def test_a_killed_execution_lasts_until_its_kill() -> None:
    killed = run(0, 100, 1.0, None)
    rows = {1: done(1, 101, 9.5, 2), 2: done(2, 101, 10.5), 3: done(3, 101, 11.5)}
    later = run(0, 101, 9.0, 9.5) + run(1, 101, 10.0, 10.5) + run(2, 101, 11.0, 11.5)
    ok = oracle.judge(GROUP, killed + later, [fault("kill", 5.0, 100)], rows)
    assert ok.overlaps == 0 and not ok.failed, ok.evidence
    assert ok.classified_reruns == 1 and ok.rerun_classes == {"killed during run": 1}
    early = run(0, 101, 4.0, 4.5) + run(1, 101, 10.0, 10.5) + run(2, 101, 11.0, 11.5)  # before the kill
    bad = oracle.judge(GROUP, killed + early, [fault("kill", 5.0, 100)], {**rows, 1: done(1, 101, 4.5, 2)})
    assert bad.overlaps == 1 and bad.failed


def test_the_frozen_span_is_taken_out_of_an_execution() -> None:
    frozen = run(0, 100, 1.0, 20.0)  # SIGSTOP at 2 s, SIGCONT at 15 s
    other = run(1, 101, 5.0, 6.0) + run(2, 101, 7.0, 8.0)
    faults = [fault("stop", 2.0, 100), fault("cont", 15.0, 100)]
    rows = {1: done(1, 100, 20.0), 2: done(2, 101, 6.0), 3: done(3, 101, 8.0)}
    verdict = oracle.judge(GROUP, frozen + other, faults, rows)
    assert verdict.overlaps == 0 and verdict.zombie_tails == 0
    inside_tail = run(1, 101, 16.0, 17.0) + run(2, 101, 21.0, 22.0)
    rows = {1: done(1, 100, 20.0), 2: done(2, 101, 17.0), 3: done(3, 101, 22.0)}
    verdict = oracle.judge(GROUP, frozen + inside_tail, faults, rows)
    assert verdict.overlaps == 1 and verdict.zombie_tails == 0  # job 1 was not re-run: a violation


def test_the_resumed_tail_of_a_reaped_and_rerun_job_is_a_zombie_tail() -> None:
    zombie = run(0, 100, 1.0, 20.0)  # frozen 2..15 s, reaped meanwhile
    rerun = run(0, 101, 8.0, 16.0)  # overlaps the zombie's tail 15..16 s
    rest = run(1, 101, 21.0, 22.0) + run(2, 101, 23.0, 24.0)
    faults = [fault("stop", 2.0, 100), fault("cont", 15.0, 100)]
    rows = {1: done(1, 101, 16.0, 2), 2: done(2, 101, 22.0), 3: done(3, 101, 24.0)}
    verdict = oracle.judge(GROUP, zombie + rerun + rest, faults, rows, reaped={1})
    assert (verdict.zombie_tails, verdict.overlaps) == (1, 0)
    assert verdict.rerun_classes == {"frozen during run": 1}
    assert not verdict.failed, verdict.evidence
    assert "reaper message yes" in verdict.evidence["re-run (frozen during run)"][0]


def test_first_starts_out_of_priority_order_are_violations() -> None:
    events = run(2, 100, 1.0, 1.1) + run(0, 100, 2.0, 2.1) + run(1, 100, 3.0, 3.1)  # job 3 (prio 2) first
    rows = {1: done(1, 100, 2.1), 2: done(2, 100, 3.1), 3: done(3, 100, 1.1)}
    verdict = oracle.judge(GROUP, events, [], rows)
    assert verdict.order_violations == 1 and verdict.failed
    assert "job 3 (2, 3) started before job" in verdict.evidence["order"][0]


def test_a_job_that_never_ran_while_later_ones_did_is_an_order_violation_and_lost() -> None:
    events = run(1, 100, 1.0, 1.1) + run(2, 100, 2.0, 2.1)
    rows = {1: Row(1, 1, 0, None, None), 2: done(2, 100, 1.1), 3: done(3, 100, 2.1)}
    verdict = oracle.judge(GROUP, events, [], rows)
    assert (verdict.order_violations, verdict.lost, verdict.stuck) == (2, 1, 1)
    assert verdict.stuck_states == {1: 1} and verdict.drain_s is None


def test_a_start_without_end_or_kill_is_lost() -> None:
    events = run(3, 100, 1.0, None)
    verdict = oracle.judge([FREE], events, [], {4: Row(4, 2, 1, None, 100)}, run_end=10 * S)
    assert verdict.lost == 1 and verdict.stuck == 1 and verdict.failed
    assert "unterminated" in verdict.evidence


def test_a_second_completion_without_a_fault_is_unexplained() -> None:
    events = run(3, 100, 1.0, 1.1) + run(3, 101, 3.0, 3.1)
    verdict = oracle.judge([FREE], events, [], {4: done(4, 101, 3.1, 2)})
    assert (verdict.unexplained_reruns, verdict.classified_reruns) == (1, 0) and verdict.failed


def test_a_kill_after_the_end_explains_a_rerun_only_within_the_result_window() -> None:
    events = run(3, 100, 1.0, 1.1) + run(3, 101, 30.0, 30.1)
    rows = {4: done(4, 101, 30.1, 2)}
    soon = oracle.judge([FREE], events, [fault("kill", 2.0, 100)], rows)
    assert soon.rerun_classes == {"killed after end": 1} and not soon.failed
    late = oracle.judge([FREE], events, [fault("kill", 1.1 + oracle.RESULT_WINDOW_S + 1, 100)], rows)
    assert late.unexplained_reruns == 1 and late.failed


def test_a_zombies_late_result_in_the_row_is_a_mismatch() -> None:
    zombie = run(3, 100, 1.0, 20.0)  # frozen 2..15 s; the re-run ends first
    rerun = run(3, 101, 8.0, 9.0)
    faults = [fault("stop", 2.0, 100), fault("cont", 15.0, 100)]
    right = oracle.judge([FREE], zombie + rerun, faults, {4: done(4, 101, 9.0, 2)})
    assert right.row_mismatches == 0 and not right.failed, right.evidence
    overwritten = {4: Row(4, oracle.FINISHED, 2, WALL0 + 20.01, 100)}  # the zombie's pid and time
    wrong = oracle.judge([FREE], zombie + rerun, faults, overwritten)
    assert wrong.row_mismatches == 1 and wrong.failed
    text = wrong.evidence["row mismatch"][0]
    assert "pid 100 is not the last run's 101" in text and "after the zombie's end" in text
    refailed = oracle.judge([FREE], zombie + rerun, faults, {4: Row(4, 4, 1, None, 101)})
    assert refailed.row_mismatches == 1 and refailed.stuck == 1


def test_a_run_that_starts_as_its_process_resumes_is_a_zombie_start_whose_result_must_not_land() -> None:
    """Process 101 decided to run the job and froze (2..14 s) before the callback's first statement;
    the job was reaped and run by process 100 meanwhile. Its late run is classified, and the row
    must hold process 100's result (bgq fences the late one out)."""
    early = run(3, 100, 10.0, 10.1)
    late = [ev(3, "start", 101, 14.0002), ev(3, "end", 101, 17.0)]
    faults = [fault("stop", 2.0, 101), fault("cont", 14.0, 101)]
    right = oracle.judge([FREE], early + late, faults, {4: done(4, 100, 10.1, 2)})
    assert not right.failed, right.evidence
    assert right.zombie_tails == 1 and right.rerun_classes == {"frozen before start": 1}
    assert "its result was not written" in right.evidence["zombie start"][0]
    landed = oracle.judge([FREE], early + late, faults, {4: done(4, 101, 17.0, 2)})
    assert landed.row_mismatches == 1 and landed.failed
    # One that starts 1 s after the resume had time to check its claim: an unexplained re-run.
    slow = [ev(3, "start", 101, 15.0), ev(3, "end", 101, 17.0)]
    checked = oracle.judge([FREE], early + slow, faults, {4: done(4, 100, 10.1, 2)})
    assert checked.unexplained_reruns == 1 and checked.row_mismatches == 1 and checked.failed


def test_torn_lines_and_unmatched_events_are_malformed() -> None:
    events, bad = oracle.parse_ledger("1-0.ledger", ["0 start 1 5 1.0", "0 end 1 6", "garbage", ""])
    assert bad == 2 and len(events) == 1
    verdict = oracle.judge(
        [FREE], [ev(3, "end", 100, 1.0), ev(9, "start", 100, 2.0)], [], {4: done(4, 1, 1.0)}
    )
    assert verdict.malformed == 2 and verdict.failed


def test_parsers_read_what_the_app_and_the_harness_write(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("BGQ_CHAOS_LEDGER", str(tmp_path))
    app.chaos(7, "g", sleep_ms=0.1)
    (path,) = tmp_path.glob("*.ledger")
    events, bad = oracle.parse_ledger(path.name, path.read_text().splitlines())
    assert bad == 0 and [(e.token, e.event) for e in events] == [(7, "start"), (7, "end")]
    assert events[0].ns <= events[1].ns
    published = [json.dumps({"id": 12, "token": 7, "group": "g", "priority": 2})]
    assert oracle.parse_published(published) == [Job(12, 7, "g", 2)]
    faults = [json.dumps({"kind": "kill", "pid": 5, "ns": 9, "wall": 1.5, "detail": "work1"})]
    assert oracle.parse_faults(faults) == [Fault("kill", 9, 1.5, 5, "work1")]
    log = (
        "CRITICAL bgq: Stalled job reaped. (ID: 42, PID 7)\nCRITICAL bgq: Stalled job reaped. (ID: 43, PID 7)"
    )
    assert oracle.parse_reaped([log]) == {42, 43}


# --- topology faults (tools/scale/) ---


def test_a_rerun_after_a_topology_fault_is_unexplained_unless_the_topology_may_undo_results() -> None:
    """A failover to a synchronous standby must lose no written result: a re-run after it fails the
    run. Only a topology that says it may undo results (an asynchronous standby) has it classified."""
    jobs = [FREE]
    events = run(3, 100, 1.0, 1.1) + run(3, 101, 5.0, 5.1)
    rows = {4: done(4, 101, 5.1, attempts=2)}
    faults = [fault("failover", 2.0), fault("failover_done", 3.0)]
    strict = oracle.judge(jobs, events, faults, rows)
    assert strict.unexplained_reruns == 1 and strict.failed
    lenient = oracle.judge(jobs, events, faults, rows, cluster_kinds=("failover",))
    assert (lenient.unexplained_reruns, lenient.classified_reruns) == (0, 1)
    assert lenient.rerun_classes == {"failover after end": 1}
    # A fault long after the run's end (beyond RESULT_WINDOW_S) explains nothing.
    late = [fault("failover", 1.1 + oracle.RESULT_WINDOW_S + 1), fault("failover_done", 9.0)]
    events_late = run(3, 100, 1.0, 1.1) + run(3, 101, 12.0, 12.1)
    assert oracle.judge(jobs, events_late, late, rows, cluster_kinds=("failover",)).unexplained_reruns == 1


def test_recovery_measures_every_busy_unit_from_the_topology_serving_again() -> None:
    units = {100: "work0", 101: "work1", 102: "work1", 103: "work2"}  # 102: work1 restarted
    events = (
        run(0, 100, 1.0, 1.1) + run(1, 101, 1.5, 1.6)  # both busy before the fault at 2.0
        + run(2, 100, 4.5, 4.6) + run(3, 102, 6.0, 6.1)  # back 0.5 s and 2.0 s after done (4.0)
        + run(4, 103, 20.0, 20.1)  # work2 was not busy before: not waited for
    )  # fmt: skip
    faults = [fault("node_kill", 2.0), fault("node_kill_done", 4.0), fault("kill", 3.0, 101)]
    (rec,) = oracle.recovery(events, faults, units, ("node_kill",))
    assert (rec.kind, rec.units, rec.missing) == ("node_kill", 2, ())
    assert rec.at_s == pytest.approx(1.0)  # 2.0 s, one second after the first start
    assert rec.served_s == pytest.approx(2.0)
    assert rec.first_end_s == pytest.approx(2.6)
    assert rec.back_s == pytest.approx(2.0)


def test_recovery_from_the_fault_counts_a_cluster_node_kill_from_the_kill_itself() -> None:
    """A cluster that serves on its other nodes (Galera, RabbitMQ): the workers must be back
    within the bound of the kill, however long the killed node takes to rejoin (its `_done`)."""
    units = {100: "work0", 101: "work1"}
    events = run(0, 100, 1.0, 1.1) + run(1, 101, 1.5, 1.6) + run(2, 100, 2.5, 2.6) + run(3, 101, 5.0, 5.1)
    faults = [fault("mq_node_kill", 2.0), fault("mq_node_kill_done", 30.0)]
    (rec,) = oracle.recovery(events, faults, units, ("mq_node_kill",), from_fault=True)
    assert (rec.units, rec.missing, rec.served_s) == (2, (), pytest.approx(28.0))
    assert rec.back_s == pytest.approx(3.0)  # work1 at 5.0, 3 s after the kill
    # Counted from the rejoin, nobody started after it: the figure that hid a slow failover.
    (rec,) = oracle.recovery(events, faults, units, ("mq_node_kill",))
    assert rec.back_s is None


def test_recovery_names_a_busy_unit_that_never_came_back_while_others_worked() -> None:
    units = {100: "work0", 101: "work1"}
    events = run(0, 100, 1.0, 1.1) + run(1, 101, 1.5, 1.6) + run(2, 100, 3.0, 3.1) + run(3, 100, 30.0, 30.1)
    faults = [fault("failover", 2.0), fault("failover_done", 2.5)]
    (rec,) = oracle.recovery(events, faults, units, ("failover",))
    assert rec.missing == ("work1",) and rec.back_s is None
    # The same, but the jobs ran out soon after: work1 had nothing left to take, it is not missed.
    short = events[:-2]
    (rec,) = oracle.recovery(short, faults, units, ("failover",))
    assert rec.missing == () and rec.back_s == pytest.approx(0.5)


def test_recovery_does_not_wait_for_a_unit_the_harness_holds_frozen() -> None:
    """A worker SIGSTOPped just before a failover comes back only when the harness resumes (or
    kills) it: that is the freeze's time, not the topology's recovery."""
    units = {100: "work0", 101: "work1", 102: "work1"}
    events = (
        run(0, 100, 1.0, 1.1) + run(1, 101, 1.5, 1.6)  # both busy before the fault at 2.0
        + run(2, 100, 4.5, 4.6) + run(3, 102, 16.0, 16.1)  # work1 back only after its kill at 14
    )  # fmt: skip
    faults = [
        fault("stop", 1.8, 101),
        fault("failover", 2.0),
        fault("failover_done", 4.0),
        fault("kill", 14.0, 101),
    ]
    (rec,) = oracle.recovery(events, faults, units, ("failover",))
    assert (rec.units, rec.missing) == (1, ())
    assert rec.back_s == pytest.approx(0.5)
    # Frozen just after the topology served, before it took a job again: not waited for either.
    late = [
        fault("failover", 2.0),
        fault("failover_done", 4.0),
        fault("stop", 4.2, 101),
        fault("kill", 14.0, 101),
    ]
    (rec,) = oracle.recovery(events, late, units, ("failover",))
    assert (rec.units, rec.back_s) == (1, pytest.approx(0.5))
    # Resumed before the topology served again, it is waited for as any other.
    resumed = [*faults[:3], fault("cont", 3.0, 101)]
    (rec,) = oracle.recovery(events, resumed, units, ("failover",))
    assert rec.units == 2 and rec.back_s == pytest.approx(12.0)


def test_a_cluster_fault_explains_the_rerun_of_a_job_claimed_before_it_and_started_before_it_was_served() -> (
    None
):
    """An asynchronous failover may lose a claim: the worker had claimed the job (in a batch) on
    the old primary and starts it after the primary died, before the standby is promoted; the
    new primary has the job READY and it runs again. Started after the topology served again,
    a re-run is not explained."""
    jobs = [oracle.Job(3, 3, None, 1)]
    rows = {3: done(3, 101, 12.1, attempts=1)}
    events = run(3, 100, 2.5, 2.6) + run(3, 101, 12.0, 12.1)  # first run inside [2.0, 3.0)
    faults = [fault("failover", 2.0), fault("failover_done", 3.0)]
    lenient = oracle.judge(jobs, events, faults, rows, cluster_kinds=("failover",))
    assert (lenient.unexplained_reruns, lenient.classified_reruns) == (0, 1)
    assert lenient.row_mismatches == 0  # attempts 1: the lost claim's attempt is not in the row
    assert not lenient.failed
    after = run(3, 100, 3.5, 3.6) + run(3, 101, 12.0, 12.1)  # claimed on the new primary
    assert oracle.judge(jobs, after, faults, rows, cluster_kinds=("failover",)).unexplained_reruns == 1
