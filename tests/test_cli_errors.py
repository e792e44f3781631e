"""Every `bgq` command fails the same way: one line `bgq: <message>` on stderr and exit code 1."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from bgq import JobState
from tests.support.helpers import unique_name
from tests.test_cli import UNREACHABLE, bgq
from tests.test_operations import cli, job  # noqa: F401  (the fixture, and a row helper)

# Every command of the CLI, run against a database nobody listens on (a closed port).
COMMANDS = [
    ("work",),
    ("work", "-c", "2"),
    ("consume",),
    ("process",),
    ("monitor",),
    ("monitor", "--json"),
    ("requeue", "1", "2"),
    ("clear-finished",),
    ("install-procs",),
]


def unreachable_app(tmp_path: Path, url: str, broker: bool = False) -> str:
    module = unique_name("bgqdown")
    producer = 'producer=RabbitMQ("amqp://guest:guest@127.0.0.1:1/"),' if broker else ""
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            f"""
            import bgq
            from bgq.broker.rabbitmq import RabbitMQ

            queue = bgq.Queue(
                callbacks={{"noop": lambda: None}},
                database_url={url!r},
                table_name="background_job",
                queue="general",
                {producer}
            )
            """
        )
    )
    return module


def assert_one_line(result) -> str:
    assert result.returncode == 1, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("bgq: ") and not lines[0].startswith("bgq: bgq:"), lines[0]
    return lines[0]


@pytest.mark.parametrize("dialect_name", ["mysql", "postgres"])
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_against_an_unreachable_database_prints_one_line(tmp_path, dialect_name, command):
    module = unreachable_app(tmp_path, UNREACHABLE[dialect_name])
    env = {"BGQ_LOCKS_DIR": str(tmp_path / "locks")}
    result = bgq("--app", f"{module}:queue", *command, pythonpath=tmp_path, env=env, timeout=90)
    line = assert_one_line(result)
    assert "Cannot reach the database" in line
    assert result.stdout == ""


@pytest.mark.parametrize("dialect_name", ["mysql", "postgres"])
def test_demo_against_an_unreachable_database_prints_one_line(dialect_name):
    result = bgq("--database-url", UNREACHABLE[dialect_name], "demo", timeout=90)
    assert "Cannot reach the database" in assert_one_line(result)


@pytest.mark.parametrize(
    "url",
    ["mysql://root@127.0.0.1:3306/bgq_no_such_db", "postgresql://postgres@127.0.0.1:5432/bgq_no_such_db"],
    ids=["mysql", "postgres"],
)
def test_a_database_that_does_not_exist_is_one_line_on_both_dialects(url):
    line = assert_one_line(bgq("--database-url", url, "--table", unique_name("bgqnodb"), "install-procs"))
    assert "Cannot reach the database" in line and "bgq_no_such_db" in line, line


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://root@127.0.0.1:3306/test?conect_timeout=5", "pymysql.connect() got an unexpected keyword"),
        (
            "postgresql://postgres@127.0.0.1:5432/test?conect_timeout=5",
            'invalid connection option "conect_timeout"',
        ),
    ],
    ids=["mysql", "postgres"],
)
def test_a_url_option_the_driver_does_not_take_is_one_line(url, says):
    """A misspelt option in the database URL: one line naming it, not a driver's traceback."""
    line = assert_one_line(bgq("--database-url", url, "--table", unique_name("bgqopt"), "install-procs"))
    assert says in line, line


@pytest.mark.parametrize(
    ("command", "broker"),
    [(("work", "bad queue!"), False), (("work", "-c", "2", "12"), False), (("consume", "a/b"), True)],
    ids=["work", "work -c 2 digits", "consume"],
)
def test_a_sub_queue_no_callback_could_have_is_refused_before_connecting(tmp_path, command, broker):
    """The same characters as a callback's queue (letters, digits, _ . -, not digits only): anything
    else is refused in one line, before the (unreachable) database is even tried."""
    module = unreachable_app(tmp_path, UNREACHABLE["mysql"], broker=broker)
    env = {"BGQ_LOCKS_DIR": str(tmp_path / "locks")}
    result = bgq("--app", f"{module}:queue", *command, pythonpath=tmp_path, env=env, timeout=90)
    line = assert_one_line(result)
    assert f"Invalid sub-queue {command[-1]!r}" in line, line


@pytest.mark.parametrize(
    ("command", "broker"), [(("work", "nosuchsub"), False), (("consume", "nosuchsub"), True)]
)
def test_a_sub_queue_no_callback_is_in_is_refused_before_connecting(tmp_path, command, broker):
    """A typo in the sub-queue would wait for ever (or fail other apps' jobs as unknown)."""
    module = unreachable_app(tmp_path, UNREACHABLE["mysql"], broker=broker)
    env = {"BGQ_LOCKS_DIR": str(tmp_path / "locks")}
    result = bgq("--app", f"{module}:queue", *command, pythonpath=tmp_path, env=env, timeout=90)
    line = assert_one_line(result)
    assert "No callback of this queue is in the sub-queue 'nosuchsub' (its sub-queues: none)" in line, line


def test_reload_consumers_with_an_unreachable_broker_prints_one_line(tmp_path):
    module = unreachable_app(tmp_path, UNREACHABLE["mysql"], broker=True)
    env = {"BGQ_LOCKS_DIR": str(tmp_path / "locks")}
    result = bgq(
        "--app", f"{module}:queue", "reload-consumers", "2", pythonpath=tmp_path, env=env, timeout=90
    )
    assert_one_line(result)


def test_requeue_of_a_missing_job_says_so_once(cli, make_queue, installed):  # noqa: F811
    result = cli("requeue", "999999")
    assert result.returncode == 1
    assert result.stderr == "bgq: job 999999: no such job\n"


def test_requeue_goes_on_after_a_job_it_cannot_requeue(cli, make_queue, installed):  # noqa: F811
    queue = make_queue()
    failed = job(queue, installed, JobState.PERMANENTLY_FAILED)
    running = job(queue, installed, JobState.PROCESSING)
    result = cli("requeue", "999999", str(running), str(failed))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "bgq: job 999999: no such job",
        f"bgq: job {running}: the job is PROCESSING; its worker owns it",
    ]
    assert result.stdout == f"requeued {failed} (was state {int(JobState.PERMANENTLY_FAILED)})\n"


@pytest.mark.parametrize("command", ["requeue", "cancel"])
def test_an_id_outside_bigint_is_no_such_job_and_the_others_go_on(cli, make_queue, installed, command):  # noqa: F811
    """Not the database's out-of-range error, which also stopped the command before the next id."""
    failed = job(make_queue(), installed, JobState.TEMPORARILY_FAILED)
    huge = "99999999999999999999999"
    result = cli(command, huge, str(failed), "--reason", "x")
    assert result.returncode == 1
    assert result.stderr == f"bgq: job {huge}: no such job\n"
    done = f"requeued {failed} " if command == "requeue" else f"{failed}: cancelled "
    assert result.stdout.startswith(done), result.stdout
