"""The chaos oracle: pure functions that judge a run from the callbacks' ledger, never from bgq's table.

Inputs (all plain data, parsed by `parse_*` from the files the harness and the app module write):

- the published jobs (id, token, group, priority), recorded by the harness at publish time;
- the ledger: per worker process one file of lines `token event pid monotonic_ns wall`, written by
  the callback itself (`start` before its sleep, `end` after it);
- the fault log: what the harness did to which pid and when (kill, stop, cont, dbkill,
  broker_stop, broker_start);
- the reaper's "Stalled job reaped. (ID: n" lines from the workers' stderr (evidence only);
- the end-state snapshot of bgq's table (state, attempts, finished_at, pid per id), used only for
  the stuck count (e) and the zombie-result check (f).

Checks (a)-(d) use the ledger, the published list and the fault log alone.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

FINISHED = 3
#: An execution's worker killed or frozen within this many seconds after the callback's end explains
#: a re-run: the result may not have been written yet (bgq writes it right after the callback).
RESULT_WINDOW_S = 5.0
#: Clock tolerance (s) between the callback's wall time and the database's finished_at.
CLOCK_TOLERANCE_S = 0.5
#: A callback that starts within this many seconds after its process was resumed from a freeze
#: (SIGCONT) is a zombie start: the process decided to run the job before it froze, and no queue
#: can stop a frozen process between its last check of the claim and the callback's first
#: statement (bgq fences the result of a run on a lost claim). The window is a judgement, not a
#: measurement: a process that resumed and then checked its claim on the database usually takes
#: longer; a double run that slips under it is still caught by check_rows if its result lands.
ZOMBIE_START_S = 0.005
EXAMPLES = 5  # evidence lines kept per kind

REAPED_RE = re.compile(r"Stalled job reaped\. \(ID: (\d+)")


@dataclass(frozen=True)
class Job:
    id: int
    token: int
    group: str | None
    priority: int

    @property
    def key(self) -> tuple[int, int]:
        return (self.priority, self.id)


@dataclass(frozen=True)
class Event:
    token: int
    event: str  # start | end
    pid: int
    ns: int  # time.monotonic_ns() (system-wide on Linux)
    wall: float  # time.time()
    proc: str  # the ledger file: one per worker process


@dataclass(frozen=True)
class Fault:
    kind: str  # kill | stop | cont | dbkill | broker_stop | broker_start
    ns: int
    wall: float
    pid: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class Row:
    id: int
    state: int
    attempts: int
    finished_at: float | None  # epoch seconds
    pid: int | None


@dataclass
class Execution:
    """One run of a callback in one process: start..end, or start..kill time; minus frozen spans."""

    job: Job
    pid: int
    proc: str
    start: int
    end: int | None  # the callback's own 'end' event
    start_wall: float
    end_wall: float | None
    cut: int | None = None  # kill time, when the process was killed before 'end'
    stops: list[tuple[int, int]] = field(default_factory=list)  # frozen spans inside the execution
    interrupt: tuple[int, str] | None = None  # first kill/stop of its pid at or after start
    resumed: int | None = None  # a SIGCONT of its pid at most ZOMBIE_START_S before its start

    @property
    def stop_ns(self) -> int:
        """Where the execution's interval ends."""
        return self.end if self.end is not None else self.cut if self.cut is not None else self.start

    def segments(self) -> list[tuple[int, int]]:
        """The interval with the frozen spans taken out."""
        out, cursor = [], self.start
        for a, b in sorted(self.stops):
            if a > cursor:
                out.append((cursor, min(a, self.stop_ns)))
            cursor = max(cursor, b)
        if cursor < self.stop_ns:
            out.append((cursor, self.stop_ns))
        return [s for s in out if s[1] > s[0]]

    def describe(self) -> str:
        end = "end" if self.end is not None else ("killed" if self.cut is not None else "no end")
        frozen = f", frozen {len(self.stops)}x" if self.stops else ""
        return f"job {self.job.id} pid {self.pid} [{self.start}..{self.stop_ns} {end}{frozen}]"


@dataclass
class Verdict:
    """What the oracle found in one run; `failed` when any violation or stuck job."""

    published: int = 0
    completed: int = 0  # jobs with at least one 'end'
    executions: int = 0
    overlaps: int = 0
    zombie_tails: int = 0
    order_violations: int = 0
    lost: int = 0
    unexplained_reruns: int = 0
    classified_reruns: int = 0
    rerun_classes: dict[str, int] = field(default_factory=dict)
    row_mismatches: int = 0
    malformed: int = 0
    stuck: int = 0
    stuck_states: dict[int, int] = field(default_factory=dict)
    drain_s: float | None = None  # last job's end after the last fault; None: not all done
    max_gap_s: float = 0.0  # longest time between two consecutive job ends: no progress at all
    max_gap_at_s: float = 0.0  # when that gap began, in seconds after the first start
    evidence: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    @property
    def failed(self) -> bool:
        return bool(
            self.overlaps or self.order_violations or self.lost or self.unexplained_reruns
            or self.row_mismatches or self.malformed or self.stuck
        )  # fmt: skip

    def note(self, kind: str, text: str) -> None:
        if len(self.evidence[kind]) < EXAMPLES:
            self.evidence[kind].append(text)


# --- parsing the files ---


def parse_published(lines: Iterable[str]) -> list[Job]:
    out = []
    for line in lines:
        if line.strip():
            d = json.loads(line)
            out.append(Job(int(d["id"]), int(d["token"]), d["group"], int(d["priority"])))
    return out


def parse_ledger(name: str, lines: Iterable[str]) -> tuple[list[Event], int]:
    """One process's ledger file: its events, and how many lines were torn or unreadable."""
    events, bad = [], 0
    for line in lines:
        parts = line.split()
        if len(parts) != 5 or parts[1] not in ("start", "end"):
            bad += bool(line.strip())
            continue
        try:
            events.append(Event(int(parts[0]), parts[1], int(parts[2]), int(parts[3]), float(parts[4]), name))
        except ValueError:
            bad += 1
    return events, bad


def parse_faults(lines: Iterable[str]) -> list[Fault]:
    out = []
    for line in lines:
        if line.strip():
            d = json.loads(line)
            out.append(Fault(d["kind"], int(d["ns"]), float(d["wall"]), d.get("pid"), d.get("detail", "")))
    return out


def parse_reaped(texts: Iterable[str]) -> set[int]:
    """Job ids named by the reaper's "Stalled job reaped. (ID: n" messages in worker logs."""
    return {int(m) for text in texts for m in REAPED_RE.findall(text)}


# --- building executions ---


def executions(
    jobs: Sequence[Job],
    events: Sequence[Event],
    faults: Sequence[Fault],
    verdict: Verdict,
    run_end: int,
    cluster_kinds: Sequence[str] = (),
) -> list[Execution]:
    """Pair each process's start/end lines into executions; cut unfinished ones at their kill.

    `cluster_kinds`: faults of a whole topology (no pid) that may undo a result already written,
    such as a failover to an asynchronous standby: each one interrupts every execution that
    started before it, as a kill of its process would, and every execution that started before
    the topology served again (its job was claimed before the fault: that claim may be lost)."""
    by_token = {j.token: j for j in jobs}
    kills: dict[int, list[int]] = defaultdict(list)
    stops: dict[int, list[tuple[int, int]]] = defaultdict(list)
    open_stop: dict[int, int] = {}
    for f in sorted(faults, key=lambda f: f.ns):
        if f.pid is None:
            continue
        if f.kind == "kill":
            kills[f.pid].append(f.ns)
            if f.pid in open_stop:  # killed while frozen: the frozen span ends with it
                stops[f.pid].append((open_stop.pop(f.pid), f.ns))
        elif f.kind == "stop":
            open_stop.setdefault(f.pid, f.ns)
        elif f.kind == "cont" and f.pid in open_stop:
            stops[f.pid].append((open_stop.pop(f.pid), f.ns))
    for pid, a in open_stop.items():
        stops[pid].append((a, run_end))
    # Each cluster fault with the instant the topology served again (its `_done`; the run's end
    # if it never did): a job that started in between was claimed before the fault (no node took
    # writes meanwhile), and that claim may be what the fault undid.
    ordered = sorted(faults, key=lambda f: f.ns)
    cluster = [
        (f, next((g.ns for g in ordered[i + 1 :] if g.kind == f.kind + "_done"), run_end))
        for i, f in enumerate(ordered)
        if f.pid is None and f.kind in cluster_kinds
    ]

    out: list[Execution] = []
    by_proc: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_proc[e.proc].append(e)
    for proc, evs in by_proc.items():
        current: Execution | None = None
        for e in evs:  # file order is the process's own order
            job = by_token.get(e.token)
            if job is None:
                verdict.malformed += 1
                verdict.note("malformed", f"{proc}: token {e.token} was never published")
                continue
            if e.event == "start":
                if current is not None:
                    verdict.malformed += 1
                    verdict.note("malformed", f"{proc}: start of token {e.token} inside {current.describe()}")
                    current.cut = e.ns
                    out.append(current)
                current = Execution(job, e.pid, proc, e.ns, None, e.wall, None)
            elif current is None or current.job.token != e.token:
                verdict.malformed += 1
                verdict.note("malformed", f"{proc}: end of token {e.token} without its start")
            else:
                current.end, current.end_wall = e.ns, e.wall
                out.append(current)
                current = None
        if current is not None:
            out.append(current)
    for ex in out:
        later = [k for k in kills.get(ex.pid, []) if k >= ex.start]
        if ex.end is None:
            ex.cut = later[0] if later else run_end
            if not later:
                verdict.note("unterminated", f"{ex.describe()}: no end and no kill (cut at the run's end)")
        ex.stops = [(a, b) for a, b in stops.get(ex.pid, []) if a < ex.stop_ns and b > ex.start]
        window = int(ZOMBIE_START_S * 1e9)
        ex.resumed = next((b for a, b in stops.get(ex.pid, []) if ex.start - window <= b <= ex.start), None)
        interrupts = [(k, "killed") for k in later]
        interrupts += [(a, "frozen") for a, _ in stops.get(ex.pid, []) if a >= ex.start]
        interrupts += [(f.ns, f.kind) for f, served in cluster if f.ns >= ex.start or ex.start < served]
        ex.interrupt = min(interrupts) if interrupts else None
    out.sort(key=lambda x: x.start)
    return out


# --- the checks ---


def _resumed_tail(ex: Execution, a: int, b: int) -> bool:
    """The overlap [a, b) lies in the part of `ex` after its last SIGCONT."""
    return bool(ex.stops) and a >= max(s[1] for s in ex.stops)


def _zombie(ex: Execution, a: int, b: int, starts: list[int]) -> bool:
    """[a, b) is in the resumed tail of frozen `ex`, whose job started again after the freeze began."""
    if not _resumed_tail(ex, a, b):
        return False
    frozen_at = min(s[0] for s in ex.stops)
    return any(s > frozen_at for s in starts if s != ex.start)


def check_overlaps(execs: Sequence[Execution], verdict: Verdict) -> None:
    """(a) No two executions of one group (or of one ungrouped job) overlap in time."""
    by_group: dict[object, list[tuple[int, int, int]]] = defaultdict(list)
    for i, ex in enumerate(execs):
        key = ("g", ex.job.group) if ex.job.group is not None else ("j", ex.job.id)
        for a, b in ex.segments():
            by_group[key].append((a, b, i))
    rerun_after: dict[int, list[int]] = defaultdict(list)
    for ex in execs:
        rerun_after[ex.job.id].append(ex.start)
    seen: set[tuple[int, int]] = set()
    for segs in by_group.values():
        segs.sort()
        active: list[tuple[int, int, int]] = []
        for a, b, i in segs:
            active = [s for s in active if s[1] > a]
            for _, b2, j in active:
                pair = (min(i, j), max(i, j))
                if i == j or pair in seen:
                    continue
                seen.add(pair)
                lo, hi = a, min(b, b2)
                x, y = execs[i], execs[j]
                zombie = next((z for z in (x, y) if _zombie(z, lo, hi, rerun_after[z.job.id])), None)
                if zombie is not None:
                    verdict.zombie_tails += 1
                    verdict.note(
                        "zombie tail",
                        f"{x.describe()} and {y.describe()} overlap {(hi - lo) / 1e6:.1f} ms in the resumed "
                        f"tail of job {zombie.job.id} (frozen {zombie.stops}), which was re-run",
                    )
                else:
                    verdict.overlaps += 1
                    verdict.note(
                        "overlap", f"{x.describe()} and {y.describe()} overlap {(hi - lo) / 1e6:.1f} ms"
                    )
            active.append((a, b, i))


def check_order(jobs: Sequence[Job], execs: Sequence[Execution], verdict: Verdict) -> None:
    """(b) Per group, first starts follow (priority, id) over the published jobs."""
    first: dict[int, int] = {}
    for ex in execs:
        first[ex.job.id] = min(first.get(ex.job.id, ex.start), ex.start)
    groups: dict[str, list[Job]] = defaultdict(list)
    for j in jobs:
        if j.group is not None:
            groups[j.group].append(j)
    inf = float("inf")
    for group, members in groups.items():
        members.sort(key=lambda j: j.key)
        worst: float = -inf
        worst_job: Job | None = None
        for j in members:
            t = first.get(j.id)
            if t is not None and worst > t and worst_job is not None:
                verdict.order_violations += 1
                ahead = "never started" if worst == inf else "started later"
                verdict.note(
                    "order",
                    f"group {group}: job {j.id} {j.key} started before job {worst_job.id} "
                    f"{worst_job.key} ({ahead})",
                )
            value = inf if t is None else t
            if value > worst:
                worst, worst_job = value, j


def check_completions(
    jobs: Sequence[Job],
    execs: Sequence[Execution],
    rows: Mapping[int, Row],
    reaped: set[int],
    verdict: Verdict,
) -> None:
    """(c) once each; a re-run only after a killed or frozen run, classified. (d) lost."""
    per_job: dict[int, list[Execution]] = defaultdict(list)
    for ex in execs:
        per_job[ex.job.id].append(ex)
    window = int(RESULT_WINDOW_S * 1e9)
    for job in jobs:
        runs = per_job.get(job.id, [])
        if not any(r.end is not None for r in runs):
            verdict.lost += 1
            row = rows.get(job.id)
            verdict.note(
                "lost",
                f"job {job.id} group {job.group}: {len(runs)} start(s), no end; row "
                + (f"state {row.state} attempts {row.attempts}" if row else "missing"),
            )
            continue
        verdict.completed += 1
        for k in range(1, len(runs)):
            rerun = runs[k]
            reason = "frozen before start" if rerun.resumed is not None else None  # a zombie start
            for prev in runs[:k] if reason is None else []:
                if prev.interrupt is None:
                    continue
                t, how = prev.interrupt
                limit = (prev.end if prev.end is not None else prev.stop_ns) + window
                if t <= min(limit, rerun.start):
                    reason = f"{how} {'during run' if prev.end is None or t < prev.end else 'after end'}"
                    break
            row = rows.get(job.id)
            evidence = (
                f"job {job.id}: run {k + 1} at {rerun.start} after {runs[k - 1].describe()}; row attempts "
                f"{row.attempts if row else '?'}; reaper message {'yes' if job.id in reaped else 'no'}"
            )
            if reason is None:
                verdict.unexplained_reruns += 1
                verdict.note("unexplained re-run", evidence)
            else:
                verdict.classified_reruns += 1
                verdict.rerun_classes[reason] = verdict.rerun_classes.get(reason, 0) + 1
                verdict.note(f"re-run ({reason})", evidence)


def check_rows(
    execs: Sequence[Execution], rows: Mapping[int, Row], verdict: Verdict, cluster_kinds: Sequence[str] = ()
) -> None:
    """(f) For a re-run job whose last run completed, the row is the last run's, not a zombie's. A
    last run that is a zombie start (ZOMBIE_START_S) after another run completed is set aside: the
    row must be the run before it, and not the zombie start's result. A run a cluster fault
    interrupted may be missing from the row's attempts (the fault undid its claim)."""
    per_job: dict[int, list[Execution]] = defaultdict(list)
    for ex in execs:
        per_job[ex.job.id].append(ex)
    for job_id, runs in per_job.items():
        row = rows.get(job_id)
        zombie_start = runs[-1] if len(runs) >= 2 and runs[-1].resumed is not None else None
        if zombie_start is not None and any(r.end is not None for r in runs[:-1]):
            verdict.zombie_tails += 1
            landed = (
                row is not None
                and row.pid == zombie_start.pid
                and zombie_start.end_wall is not None
                and row.finished_at is not None
                and row.finished_at >= zombie_start.end_wall - CLOCK_TOLERANCE_S
            )
            after = (zombie_start.start - (zombie_start.resumed or 0)) / 1e6
            verdict.note(
                "zombie start",
                f"{zombie_start.describe()} started {after:.1f} ms after its process was resumed, "
                "after an earlier run had completed"
                + ("; its result was written" if landed else "; its result was not written"),
            )
            if landed:
                verdict.row_mismatches += 1
                verdict.note("row mismatch", f"job {job_id}: the zombie start's result was written")
                continue
            runs = runs[:-1]
        last = runs[-1]
        if len(runs) < 2 or last.end is None or last.end_wall is None:
            continue
        problems = []
        if row is None:
            problems.append("row missing")
        else:
            if row.state != FINISHED:
                problems.append(f"state {row.state}")
            if row.pid is not None and row.pid != last.pid:
                problems.append(f"pid {row.pid} is not the last run's {last.pid}")
            undone = sum(1 for r in runs[:-1] if r.interrupt is not None and r.interrupt[1] in cluster_kinds)
            if row.attempts < len(runs) - undone:
                problems.append(f"attempts {row.attempts} < {len(runs)} runs")
            if row.finished_at is None or row.finished_at < last.end_wall - CLOCK_TOLERANCE_S:
                problems.append(
                    f"finished_at {row.finished_at} before the last run's end {last.end_wall:.3f}"
                )
            for z in runs[:-1]:
                late = z.end_wall is not None and z.end_wall > last.end_wall + CLOCK_TOLERANCE_S
                if late and row.finished_at is not None and row.finished_at >= z.end_wall:
                    problems.append(f"finished_at {row.finished_at} after the zombie's end {z.end_wall:.3f}")
        if problems:
            verdict.row_mismatches += 1
            verdict.note("row mismatch", f"job {job_id}: " + "; ".join(problems))


def judge(
    jobs: Sequence[Job],
    events: Sequence[Event],
    faults: Sequence[Fault],
    rows: Mapping[int, Row],
    reaped: set[int] = frozenset(),  # type: ignore[assignment]
    run_end: int | None = None,
    torn_lines: int = 0,
    cluster_kinds: Sequence[str] = (),
) -> Verdict:
    """Every check over one run; `run_end` (monotonic ns) cuts executions that have no end;
    `cluster_kinds` as in `executions`."""
    verdict = Verdict(published=len(jobs))
    if torn_lines:
        verdict.malformed += torn_lines
        verdict.note("malformed", f"{torn_lines} unreadable ledger line(s)")
    end = run_end if run_end is not None else max([e.ns for e in events] + [f.ns for f in faults] + [0])
    execs = executions(jobs, events, faults, verdict, end, cluster_kinds)
    verdict.executions = len(execs)
    check_overlaps(execs, verdict)
    check_order(jobs, execs, verdict)
    check_completions(jobs, execs, rows, reaped, verdict)
    check_rows(execs, rows, verdict, cluster_kinds)
    for job in jobs:
        row = rows.get(job.id)
        state = row.state if row is not None else -99
        if state != FINISHED:
            verdict.stuck += 1
            verdict.stuck_states[state] = verdict.stuck_states.get(state, 0) + 1
    ends = sorted(e.ns for e in events if e.event == "end")
    if len(ends) > 1:
        gap, at = max((b - a, -a) for a, b in zip(ends, ends[1:], strict=False))  # the first longest
        verdict.max_gap_s = gap / 1e9
        verdict.max_gap_at_s = (-at - min(e.ns for e in events)) / 1e9
    if verdict.lost == 0 and ends:
        last_fault = max([f.ns for f in faults if f.detail != "teardown"], default=None)
        verdict.drain_s = 0.0 if last_fault is None else max(0.0, (max(ends) - last_fault) / 1e9)
    return verdict


@dataclass(frozen=True)
class Recovery:
    """How a run came back from one topology fault (tools/scale/)."""

    kind: str
    at_s: float  # the fault, in seconds after the first start
    served_s: float | None  # from the fault to its `<kind>_done` mark (the topology served again)
    first_end_s: float | None  # from the fault to the first job end after it, anywhere
    back_s: float | None  # from `_done` (or the fault) until every unit busy before it started a job again
    units: int  # how many units were busy in the BUSY_S before the fault
    missing: tuple[str, ...] = ()  # units busy before that never started a job again (jobs were left)


BUSY_S = 10.0  # a unit that started a job this long before a fault was busy: it must come back


def _held(faults: Sequence[Fault], at: int, pid_units: Mapping[int, str]) -> set[str]:
    """The units the harness itself holds frozen at `at` (a stop with no cont or kill before
    `at`): they cannot take a job until it lets them go, whatever the topology does."""
    frozen: dict[int, bool] = {}
    for g in faults:  # in time order
        if g.ns >= at:
            break
        if g.pid is not None and g.kind == "stop":
            frozen[g.pid] = True
        elif g.pid is not None and g.kind in ("cont", "kill"):
            frozen[g.pid] = False
    return {pid_units.get(pid, f"pid {pid}") for pid, held in frozen.items() if held}


def _hit(faults: Sequence[Fault], after: int, pid_units: Mapping[int, str]) -> dict[str, list[int]]:
    """When the harness froze or killed each unit at or after `after`."""
    out: dict[str, list[int]] = defaultdict(list)
    for g in faults:
        if g.pid is not None and g.kind in ("stop", "kill") and g.ns >= after:
            out[pid_units.get(g.pid, f"pid {g.pid}")].append(g.ns)
    return out


def recovery(
    events: Sequence[Event],
    faults: Sequence[Fault],
    pid_units: Mapping[int, str],
    kinds: Sequence[str],
    from_fault: bool = False,
) -> list[Recovery]:
    """Per topology fault of `kinds`: when the topology served again, when the first job ended
    after it, and when every worker unit (a supervised worker; its restarted pids and `-c N`
    children belong to it) that was busy before the fault had started a job again, counted from
    the fault's `_done` mark (the topology serves again), or with `from_fault` from the fault
    itself (a cluster that keeps serving on its other nodes while one is down). A unit is only
    missed when jobs still started elsewhere more than BUSY_S after the fault was served. A unit
    the harness holds frozen (SIGSTOP) when the topology serves again, or freezes or kills before
    the unit took a job again, is not waited for: its return measures the harness's fault, not
    the topology."""
    if not events:
        return []
    t0 = min(e.ns for e in events)
    starts = sorted((e.ns, pid_units.get(e.pid, f"pid {e.pid}")) for e in events if e.event == "start")
    ends = sorted(e.ns for e in events if e.event == "end")
    out = []
    ordered = sorted(faults, key=lambda f: f.ns)
    for i, f in enumerate(ordered):
        if f.kind not in kinds:
            continue
        done = next((g.ns for g in ordered[i + 1 :] if g.kind == f.kind + "_done"), None)
        base = done if done is not None and not from_fault else f.ns
        busy = {u for ns, u in starts if f.ns - int(BUSY_S * 1e9) <= ns < f.ns}
        busy -= _held(ordered, base, pid_units)
        back: dict[str, int] = {}
        for ns, u in starts:
            if ns >= base and u in busy and u not in back:
                back[u] = ns
        # Nor for a unit the harness froze or killed after the topology served and before the
        # unit took a job again: it is the harness's fault that holds it, not the topology's.
        hit = _hit(ordered, base, pid_units)
        for u in [u for u in busy if any(t < back.get(u, 1 << 62) for t in hit.get(u, ()))]:
            busy.discard(u)
            back.pop(u, None)
        last_start = starts[-1][0] if starts else 0
        missing = tuple(sorted(u for u in busy - set(back) if last_start > base + int(BUSY_S * 1e9)))
        first_end = next((ns for ns in ends if ns >= f.ns), None)
        out.append(
            Recovery(
                f.kind,
                (f.ns - t0) / 1e9,
                None if done is None else (done - f.ns) / 1e9,
                None if first_end is None else (first_end - f.ns) / 1e9,
                (max(back.values()) - base) / 1e9 if back and not missing else None,
                len(busy),
                missing,
            )
        )
    return out
