"""`bgq demo`: on the embedded PostgreSQL with no database configured, and on each real server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import AMQP_URL, probe_rabbitmq, require_service
from tests.support.helpers import host_lock

BGQ = shutil.which("bgq", path=str(Path(sys.executable).parent)) or "bgq"


@pytest.fixture(autouse=True)
def one_demo_at_a_time():
    """`bgq demo` always uses the table bgq_demo and the broker queues bgqdemo_*: two demos at
    once (xdist workers, or another pytest run on this host) would take each other's jobs."""
    with host_lock("demo"):
        yield


def _run_demo(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [BGQ, *args] if "demo" in args else [BGQ, *args, "demo"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)


def test_demo_runs_on_the_embedded_default(tmp_path):
    """No database URL anywhere: bgq starts an embedded PostgreSQL and the group runs a b d e g c f."""
    pytest.importorskip("pgserver", reason="the embedded extra (pgserver) is not installed")
    # (a container has no XDG_RUNTIME_DIR: pgserver's platformdirs must not warn about it)
    env = {k: v for k, v in os.environ.items() if k not in ("BGQ_DATABASE_URL", "XDG_RUNTIME_DIR")}
    env["BGQ_DATA_DIR"] = str(tmp_path / "pg")
    result = _run_demo(env)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr
    assert "bgq demo on postgres" in result.stdout
    assert "the group ran in the order: a b d e g c f" in result.stdout
    assert result.stdout.count("start  mail-") == 3


def test_demo_runs_on_a_configured_server(db_url):
    result = _run_demo(dict(os.environ), "--database-url", db_url)
    assert result.returncode == 0, result.stderr
    assert "the group ran in the order: a b d e g c f" in result.stdout


def test_demo_runs_through_the_broker_with_two_consumers(db_url):
    require_service("RabbitMQ", probe_rabbitmq)
    result = _run_demo(dict(os.environ), "--database-url", db_url, "demo", "--broker", AMQP_URL)
    assert result.returncode == 0, result.stderr
    assert "2 consumers" in result.stdout
    assert "the group ran in the order: a b d e g c f" in result.stdout
