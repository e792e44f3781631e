"""`make scale`'s output: a table per topology, its recovery figures, and docs/scale-out.md."""

from __future__ import annotations

import datetime as dt
import os
import re
from typing import TYPE_CHECKING

from tools.chaos.report import RunResult

if TYPE_CHECKING:
    from tools.scale.run import TopologyResult

HEADER = (
    "| mode | jobs | groups | faults: kill/stop/db + topology | wall s | jobs/s | overlaps | order | lost "
    "| unexplained re-runs | classified re-runs | stuck | drain s | recovery after each topology fault |"
)


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def recovery_cell(r: RunResult) -> str:
    """Per topology fault: at (s into the run) kind: served again / first job end / every busy
    worker back, in seconds."""
    parts = []
    for rec in r.recovery:
        back = f"not back: {', '.join(rec.missing)}" if rec.missing else _seconds(rec.back_s)
        parts.append(
            f"{rec.kind} at {rec.at_s:.0f}: served {_seconds(rec.served_s)}, first end "
            f"{_seconds(rec.first_end_s)}, {rec.units} busy back {back}"
        )
    return "; ".join(parts) or "no topology fault"


def recovery_line(r: RunResult) -> str:
    return "   recovery: " + recovery_cell(r)


def row(r: RunResult, kinds: tuple[str, ...]) -> str:
    v, f = r.verdict, r.faults
    worker = "/".join(str(f.get(k, 0)) for k in ("kill", "stop", "dbkill"))
    cluster = ", ".join(f"{f.get(k, 0)} {k}" for k in kinds)
    classes = ", ".join(f"{k} {n}" for k, n in sorted(v.rerun_classes.items()))
    cells = [
        r.mode, str(r.jobs), str(r.groups), f"{worker} + {cluster}", f"{r.wall_s:.1f}", f"{r.rate:.0f}",
        str(v.overlaps), str(v.order_violations), str(v.lost), str(v.unexplained_reruns),
        f"{v.classified_reruns}" + (f" ({classes})" if classes else ""), str(v.stuck),
        "not drained" if v.drain_s is None else f"{v.drain_s:.1f}", recovery_cell(r),
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def section(result: TopologyResult, level: str = "##") -> list[str]:
    t = result.topology
    sep = "|" + "|".join("---" for _ in HEADER.strip("|").split("|")) + "|"
    out = [f"{level} {t.name}: {t.title}", ""]
    if result.versions:
        out += [
            f"Versions: {', '.join(result.versions)}. "
            f"Page: [docs/scale-out/{t.name}.md](scale-out/{t.name}.md).",
            "",
        ]
    if result.direct is not None and result.through is not None:
        ratio = result.ratio
        floor = f" (floor {t.throughput_floor}x)" if t.throughput_floor is not None else ""
        out += [
            f"Throughput, fault-free, `bgq work` x {t.throughput_workers}, {result.direct.jobs} jobs: "
            f"direct {result.direct.rate:.0f} jobs/s, through {t.name} {result.through.rate:.0f} jobs/s"
            + (f" = **{ratio:.2f}x**{floor}" if ratio is not None else "")
            + f" (oracle: {_verdict(result.direct)} / {_verdict(result.through)}).",
            "",
        ]
    if result.runs:
        out += [
            f"Chaos runs through {t.name}, worker processes: "
            + ", ".join(f"{mode} {n}" for mode, n in result.chaos_workers.items())
            + ".",
            "",
            HEADER,
            sep,
            *(row(r, t.fault_kinds) for r in result.runs),
            "",
        ]
    for r in result.runs:
        details = [line for line in r.details(where=False) if line.startswith("  - ")]
        if details:
            out += [f"Evidence, {r.mode}:", *details, ""]
    for e in result.errors:
        out += [f"FAILED: {e}", ""]
    return out


def _verdict(r: RunResult) -> str:
    return "violations" if r.verdict.failed else "0 violations"


def text(results: list[TopologyResult]) -> str:
    return "\n".join(line for r in results for line in section(r, "==="))


INTRO = """\
# bgq beyond one server: `make scale`

bgq's users put PgBouncer in front of PostgreSQL, fail over to a standby, run Galera and RabbitMQ
clusters. `make scale` starts each of these on this machine (loopback ports only, every process
stopped by pid at the end), runs bgq's chaos harness through it with the topology's own faults
beside the harness's (SIGKILL and SIGSTOP of workers, cuts of every database session), and judges
every run with the chaos oracle, which reads only the callbacks' own ledger
([docs/reliability.md](reliability.md) says how). Each engine's page says what to configure:

- [PgBouncer in transaction pooling](scale-out/pgbouncer.md)
- [PostgreSQL primary and streaming standby](scale-out/standby.md)
- [MariaDB Galera](scale-out/galera.md)
- [RabbitMQ cluster with quorum queues](scale-out/rabbitmq.md)

Columns: *faults* are the harness's SIGKILLs / SIGSTOPs / session cuts, then the topology's own;
*recovery*, per topology fault: seconds until the topology served again (e.g. the standby promoted,
the killed node synced), until the first job ended anywhere, and until every worker that was busy
in the 10 s before the fault had started a job again: counted from the moment the topology
served again (PgBouncer, the standbys), or from the fault itself where the cluster keeps serving
on its other nodes (Galera, RabbitMQ: the workers must fail over, not wait for the node). The
bound is 10 s. *classified re-runs*:
second runs that a kill, a freeze, or (only where a topology may undo a written result, such as an
asynchronous standby) a topology fault explains; any other is *unexplained* and fails the run.
"""


def write_doc(
    path: os.PathLike[str], results: list[TopologyResult], command: str, preset: str, took: float
) -> None:
    """Write docs/scale-out.md: the intro, then one section per topology between markers. The
    sections of topologies this run did not run are kept as the last run that ran them wrote
    them, each with its own date and command, so `make scale SCALE_ARGS="--topology galera"`
    rewrites only Galera's."""
    from pathlib import Path

    target = Path(path)
    old = target.read_text() if target.exists() else ""
    kept = {m.group(1): m.group(0) for m in _SECTION.finditer(old)}
    today = dt.date.today().isoformat()
    for r in results:
        problems = r.problems(preset)
        verdict = (
            "Every run passed: no overlap, no order violation, nothing lost, no unexplained re-run, "
            "nothing stuck, every busy worker back within its bound."
            if not problems
            else "FAILED:\n\n" + "\n".join(f"- {p}" for p in problems)
        )
        body = section(r)
        body[1:1] = [
            "",
            f"Run {today}, preset `{preset}`, {os.cpu_count()} cores; `{command}` ({took / 60:.1f} min for "
            "every topology it ran).",
            "",
            verdict,
        ]
        name = r.topology.name
        kept[name] = f"<!-- scale:{name} -->\n" + "\n".join(body).rstrip() + f"\n<!-- /scale:{name} -->"
    from tools.scale.run import TOPOLOGIES

    order = [n for n in TOPOLOGIES if n in kept] + sorted(n for n in kept if n not in TOPOLOGIES)
    target.write_text(INTRO + "\n" + "\n\n".join(kept[n] for n in order) + "\n")


_SECTION = re.compile(r"<!-- scale:([\w-]+) -->.*?<!-- /scale:\1 -->", re.S)
