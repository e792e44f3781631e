"""`bgq --log-format json`: real `bgq process` and `bgq work` processes, their stderr parsed line by line."""

from __future__ import annotations

import json
import os

from bgq import JobState
from tests.support.cli import run_bgq
from tests.support.helpers import state_of, wait_until
from tests.support.work_app import ROOT
from tests.test_work import cli  # noqa: F401  (the fixture)

FIELDS = {"job_id", "callback", "queue", "group", "attempt", "outcome", "duration_ms"}


def _json_lines(text: str) -> list[dict]:
    """Every line of `text` that is a JSON object (stdout's `processed: ...` line is not)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _job_lines(records: list[dict]) -> dict[int, dict]:
    return {r["job_id"]: r for r in records if r.keys() >= FIELDS}


def test_bgq_process_logs_one_json_object_per_line_with_the_job_fields(make_queue, installed, cli):  # noqa: F811
    runner = cli()
    queue = make_queue(callbacks={"noop": print, "fail": print}, priorities=[1, 2, 3])
    ok = queue.publish("noop")
    bad = queue.publish("fail", serial_group="g-json", priority=2)
    env = {**runner.bgq_env, "BGQ_APP": "tests.support.work_app:queue"}
    done = run_bgq("--log-format", "json", "process", cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert all(line.startswith("{") for line in done.stderr.splitlines()), done.stderr  # nothing else
    records = _json_lines(done.stderr)
    assert all({"ts", "level", "logger", "message"} <= r.keys() for r in records)
    jobs = _job_lines(records)
    assert set(jobs) == {ok, bad}
    assert {k: jobs[ok][k] for k in FIELDS - {"duration_ms"}} == {
        "job_id": ok, "callback": "noop", "queue": "general", "group": None, "attempt": 1,
        "outcome": "finished",
    }  # fmt: skip
    assert {k: jobs[bad][k] for k in FIELDS - {"duration_ms"}} == {
        "job_id": bad, "callback": "fail", "queue": "general", "group": "g-json", "attempt": 1,
        "outcome": "permanently_failed",
    }  # fmt: skip
    assert all(isinstance(j["duration_ms"], float) and j["duration_ms"] >= 0 for j in jobs.values())
    assert jobs[ok]["level"] == "INFO"
    (critical,) = [r for r in records if r["level"] == "CRITICAL" and "Permanent error" in r["message"]]
    assert "TypeError: tests.support.work_app:fail always fails" in critical["exception"]
    assert (state_of(installed, ok), state_of(installed, bad)) == (
        JobState.FINISHED,
        JobState.PERMANENTLY_FAILED,
    )


def test_bgq_work_logs_json_when_bgq_log_format_says_so(make_queue, installed, cli):  # noqa: F811
    runner = cli()
    runner.env["BGQ_LOG_FORMAT"] = "json"
    queue = make_queue(callbacks={"noop": print}, priorities=[1, 2, 3])
    ids = [queue.publish("noop", serial_group="g1" if n % 2 else None) for n in range(4)]
    proc = runner.start("work")
    wait_until(lambda: all(state_of(installed, i) == JobState.FINISHED for i in ids), "the jobs to run", 30)
    code, _ = runner.terminate(proc, timeout=20)
    assert code == 0
    output = runner.output(proc)
    records = _json_lines(output)
    assert len(records) == len(output.splitlines()), output  # every line is a JSON object
    jobs = _job_lines(records)
    assert set(jobs) == set(ids)
    assert all(j["outcome"] == "finished" and j["callback"] == "noop" for j in jobs.values())
    assert [jobs[i]["group"] for i in ids] == [None, "g1", None, "g1"]
    assert os.environ.get("BGQ_LOG_FORMAT") is None  # the test process itself is untouched
