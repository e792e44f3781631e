"""Prometheus metrics (bgq/metrics.py) after a known workload: the scrape equals the table."""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import subprocess
import urllib.request
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bgq import JobState, PermanentErrorException, TemporaryErrorException, metrics
from bgq.model import WorkerMode
from bgq.modes.registry import Registry
from tests.support.cli import BGQ
from tests.support.helpers import wait_until
from tests.support.work_app import ROOT

GROUPS = ("grp-secret-a", "grp-secret-b")


def _ok(*_args: object) -> None:
    pass


def _permanent(*_args: object) -> None:
    raise PermanentErrorException("no")


def _temporary(*_args: object) -> None:
    raise TemporaryErrorException("later")


def _samples(text: bytes) -> dict[str, list]:
    """{family name: its samples} of an exposition."""
    return {f.name: f.samples for f in text_string_to_metric_families(text.decode())}


def _value(samples: list, name: str, **labels: str) -> float:
    found = [
        s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return sum(found)


def _processed(samples: dict[str, list]) -> Counter[str]:
    out: Counter[str] = Counter()
    for s in samples.get("bgq_jobs_processed", []):
        if s.name == "bgq_jobs_processed_total" and s.labels["queue"].startswith("general"):
            out[s.labels["outcome"]] += int(s.value)
    return out


def _table_counts(installed) -> dict[tuple[str, int], int]:
    rows = installed.sql("SELECT queue, state, COUNT(*) AS n FROM {t} GROUP BY queue, state")
    return {(r["queue"], int(r["state"])): int(r["n"]) for r in rows}


def test_metrics_after_a_known_workload_equal_the_table(make_queue, installed):
    metrics.enable()
    queue = make_queue(
        callbacks={"ok": _ok, "perm": _permanent, "temp": _temporary, "sub": {"callback": _ok, "queue": "x"}}
    )
    before = _processed(_samples(metrics.render(queue)))
    waits_before = _value(
        _samples(metrics.render(queue))["bgq_job_wait_seconds"], "bgq_job_wait_seconds_count"
    )
    ids = [queue.publish("ok") for _ in range(4)] + [queue.publish("sub")]
    ids += [queue.publish("perm") for _ in range(2)] + [queue.publish("temp")]
    ids += [queue.publish("ok", postpone_by=dt.timedelta(hours=1)) for _ in range(3)]  # not due: READY
    for group in GROUPS:  # a head that fails for now, and a job waiting behind it
        ids.append(queue.publish("temp", serial_group=group))
        ids.append(queue.publish("ok", serial_group=group))
    report = queue.process()
    assert report.outcomes == {"claimed": 10}

    with Registry(queue, WorkerMode.WORK, "general"):
        text = metrics.render(queue)
    samples = _samples(text)

    counts = _table_counts(installed)
    assert counts[("general", JobState.FINISHED)] == 4 and counts[("general_x", JobState.FINISHED)] == 1
    for q in ("general", "general_x"):
        for state in JobState:
            got = _value(samples["bgq_jobs"], "bgq_jobs", queue=q, state=state.name.lower())
            assert got == counts.get((q, int(state)), 0), (q, state)
    assert _value(samples["bgq_groups_blocked"], "bgq_groups_blocked", queue="general") == len(GROUPS)
    assert _value(samples["bgq_workers"], "bgq_workers", mode="work") == 1
    assert _value(samples["bgq_workers"], "bgq_workers", mode="consume") == 0
    ready_age = _value(
        samples["bgq_oldest_job_age_seconds"], "bgq_oldest_job_age_seconds", queue="general", state="ready"
    )
    assert 0 <= ready_age < 120
    assert not [s for s in samples["bgq_oldest_job_age_seconds"] if s.labels["state"] == "processing"]

    run = _processed(samples) - before
    finished = sum(n for (_, s), n in counts.items() if s == JobState.FINISHED)
    assert run == Counter(
        finished=finished,
        permanently_failed=counts[("general", JobState.PERMANENTLY_FAILED)],
        temporarily_failed=counts[("general", JobState.TEMPORARILY_FAILED)],
    )
    assert _value(samples["bgq_job_duration_seconds"], "bgq_job_duration_seconds_count", callback="perm") >= 2
    waits = _value(samples["bgq_job_wait_seconds"], "bgq_job_wait_seconds_count") - waits_before
    assert waits == sum(run.values())  # every run was a first attempt

    # Cardinality: no label value is a group name or a job id.
    values = {v for family in samples.values() for s in family for v in s.labels.values()}
    assert not values & set(GROUPS)
    assert not values & {str(i) for i in ids}


def test_reaped_jobs_are_counted(make_queue, installed):
    metrics.enable()
    queue = make_queue(stalled_job_timeout=60)
    job = queue.publish("noop")
    with installed.db.transaction() as conn:
        assert queue.procs.claim(conn, job, "general", 777, 1000, None).outcome == "claimed"
    before = _value(_samples(metrics.render(queue))["bgq_reaped"], "bgq_reaped_total", queue="general")
    assert [r.id for r in queue.reaper.run_once(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5))] == [job]
    after = _value(_samples(metrics.render(queue))["bgq_reaped"], "bgq_reaped_total", queue="general")
    assert after - before == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> bytes | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            data: bytes = answer.read()
            return data
    except OSError:
        return None


@pytest.mark.slow
def test_bgq_metrics_serves_the_table_and_bgq_work_c2_adds_its_workers_counters(
    make_queue, installed, tmp_path
):
    """`bgq metrics --port` answers /metrics from the table; `bgq work -c 2 --metrics-port` counts
    the jobs its two forked workers ran (multiprocess mode) and serves their sum."""
    queue = make_queue(callbacks={"noop": _ok, "ledger": _ok, "slow_once": _ok}, priorities=[1, 2, 3])
    for _ in range(6):
        queue.publish("noop")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BGQ_", "PROMETHEUS_"))}
    env.update(
        BGQ_TEST_WORK_URL=installed.url,
        BGQ_TEST_WORK_TABLE=installed.table,
        BGQ_APP="tests.support.work_app:queue",
    )
    table_port, work_port = _free_port(), _free_port()
    log = (tmp_path / "metrics.log").open("wb")
    commands = [
        [BGQ, "metrics", "--port", str(table_port), "--addr", "127.0.0.1"],
        [BGQ, "work", "-c", "2", "--metrics-port", str(work_port)],
    ]
    procs = [
        subprocess.Popen(c, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        for c in commands
    ]
    try:
        wait_until(lambda: _table_counts(installed) == {("general", 3): 6}, "the six jobs to finish", 60)

        # One forked worker may run all six before the other has registered: wait for both.
        def both_registered() -> dict[str, list] | None:
            text = _scrape(table_port)
            samples = _samples(text) if text else {}
            registered = _value(samples.get("bgq_workers", []), "bgq_workers", mode="work")
            return samples if registered == 2 else None

        samples = wait_until(both_registered, "bgq metrics to list the two work processes", 30)
        assert _value(samples["bgq_jobs"], "bgq_jobs", queue="general", state="finished") == 6
        text = wait_until(lambda: _scrape(work_port), "bgq work --metrics-port to answer", 30)
        samples = _samples(text)
        assert _value(samples["bgq_jobs_processed"], "bgq_jobs_processed_total", outcome="finished") == 6
        assert _value(samples["bgq_jobs"], "bgq_jobs", queue="general", state="finished") == 6
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(30) for proc in procs]
        log.close()
    assert codes == [0, 0], (tmp_path / "metrics.log").read_text()


def test_asgi_app_answers_metrics_for_the_web_console(make_queue, installed):
    """bgq.metrics.asgi_app(queue), called as an ASGI server would call it."""
    import asyncio
    import concurrent.futures

    queue = make_queue()
    queue.publish("noop")
    app = metrics.asgi_app(queue)
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/metrics", "query_string": b"", "headers": []}
    # On a thread of its own: an event loop may run on this one (the browser tests' Playwright).
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, app(scope, receive, send)).result(timeout=30)
    assert sent[0]["status"] == 200
    body = b"".join(m.get("body", b"") for m in sent[1:])
    assert _value(_samples(body)["bgq_jobs"], "bgq_jobs", queue="general", state="ready") == 1
