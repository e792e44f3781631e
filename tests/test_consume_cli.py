"""`bgq consume` and `bgq reload-consumers` as a person runs them (checklists 95, 98, 99)."""

from __future__ import annotations

import os
import textwrap

import pytest

from bgq import JobState
from tests.conftest import AMQP_URL, probe_rabbitmq, require_service
from tests.support.cli import bgq_vars, run_bgq
from tests.support.helpers import state_of


@pytest.fixture
def app(tmp_path, installed, rabbit):
    require_service("RabbitMQ", probe_rabbitmq)
    (tmp_path / "consume_app.py").write_text(
        textwrap.dedent(
            f"""
            import bgq
            from bgq.broker.rabbitmq import RabbitMQ

            queue = bgq.Queue(
                callbacks={{"noop": lambda: None}},
                database_url={installed.url!r},
                table_name={installed.table!r},
                queue={rabbit.base!r},
                priorities=[1, 2],
                producer=RabbitMQ({AMQP_URL!r}),
            )
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BGQ_")}
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["BGQ_APP"] = "consume_app:queue"
    return env


def _bgq(env, *args, timeout=60):
    """`bgq ARGS` with the app fixture's BGQ_* variables and import path."""
    return run_bgq(
        *args, env=bgq_vars(env), pythonpath=env["PYTHONPATH"].split(os.pathsep)[0], timeout=timeout
    )


def test_checklist_95_consume_j_handles_exactly_n_messages(app, broker_queue, installed, rabbit):
    queue = broker_queue(priorities=[1, 2])
    ids = [queue.publish("noop") for _ in range(3)]
    result = _bgq(app, "consume", "-j", "2")
    assert result.returncode == 0, result.stderr
    assert [state_of(installed, i) for i in ids] == [JobState.FINISHED, JobState.FINISHED, JobState.READY]
    assert rabbit.count(f"{rabbit.base}_1") == 1


@pytest.mark.parametrize("bad", ["abc", "-1", "1.5"])
def test_checklist_95_consume_j_must_be_a_whole_number(app, bad):
    result = _bgq(app, "consume", "-j", bad)
    assert result.returncode == 2 and "jobs" in result.stderr.lower()


def test_checklist_94_consume_p_error_is_reported(app):
    result = _bgq(app, "consume", "-p", "7")
    assert result.returncode == 1 and "Priority 7 is not in available priorities [1,2]" in result.stderr


def test_checklist_98_99_reload_consumers_sends_die_and_the_consumer_exits_0(app, broker_queue, rabbit):
    assert _bgq(app, "reload-consumers", "2").returncode == 0
    assert rabbit.count(f"{rabbit.base}_0") == 2
    for _ in range(2):
        result = _bgq(app, "consume")  # would run for ever without the die message
        assert result.returncode == 0, result.stderr
    assert rabbit.count(f"{rabbit.base}_0") == 0


@pytest.mark.parametrize("bad", ["0", "x", "-3"])
def test_reload_consumers_validates_its_number(app, bad):
    assert _bgq(app, "reload-consumers", bad).returncode == 2


def test_checklist_99_reload_consumers_of_a_sub_queue(app, rabbit):
    assert _bgq(app, "reload-consumers", "3", "transcribe").returncode == 0
    assert rabbit.count(f"{rabbit.base}_transcribe_0") == 3
    rabbit.bodies(f"{rabbit.base}_transcribe_0")
    rabbit.channel.queue_delete(f"{rabbit.base}_transcribe_0")
    rabbit.channel.exchange_delete(f"{rabbit.base}_transcribe_0")
