"""`bgq consume` registers in <table>_worker and serves --metrics-port (RabbitMQ, both dialects)."""

from __future__ import annotations

import signal
import subprocess

from bgq import JobState
from tests.support.cli import BGQ
from tests.support.helpers import state_of, wait_until
from tests.test_consume_cli import app  # noqa: F401  (the fixture)
from tests.test_metrics import _free_port, _samples, _scrape, _value


def test_bgq_consume_is_listed_while_it_runs_and_counts_its_jobs(app, broker_queue, installed, tmp_path):  # noqa: F811
    queue = broker_queue(priorities=[1, 2])
    ids = [queue.publish("noop") for _ in range(3)]
    port = _free_port()
    log = (tmp_path / "consume.log").open("wb")
    proc = subprocess.Popen(
        [BGQ, "consume", "--metrics-port", str(port)], env=app, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_until(lambda: all(state_of(installed, i) == JobState.FINISHED for i in ids), "the jobs", 60)
        (row,) = installed.sql("SELECT * FROM {t}_worker")
        assert (row["mode"], row["pid"]) == ("consume", proc.pid)
        samples = _samples(wait_until(lambda: _scrape(port), "/metrics", 30))
        assert _value(samples["bgq_jobs_processed"], "bgq_jobs_processed_total", outcome="finished") == 3
        assert _value(samples["bgq_workers"], "bgq_workers", mode="consume") == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        log.close()
    assert code == 0, (tmp_path / "consume.log").read_text()
    assert installed.sql("SELECT * FROM {t}_worker") == []
