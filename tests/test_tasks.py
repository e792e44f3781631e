"""`@queue.task`: registration beside `callbacks=`, publish checked by the type checker and at run time.

The publish tests run on both dialects (the `installed` fixture); the typing test runs mypy (the
project's type checker) on a module that uses tasks rightly and on one that uses them wrongly.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import mypy.api
import pytest

from bgq import ConfigError, JobState, PriorityError, PublishError, Queue
from tests.support.helpers import state_of


def count_rows(installed) -> int:
    return installed.sql("SELECT COUNT(*) AS n FROM {t}")[0]["n"]


def row_of(installed, job_id: int) -> dict:
    (row,) = installed.sql("SELECT * FROM {t} WHERE id = %s", (job_id,))
    return row


def stored(row: dict):
    value = row["parameters_json"]
    return json.loads(value) if isinstance(value, str) else value


def test_task_publish_runs_the_function_with_its_arguments(make_queue, installed):
    calls = []
    queue = make_queue(callbacks={"plain": lambda x: calls.append(("plain", x))}, priorities=[1, 2])

    @queue.task
    def send(user_id: int, subject: str, *, urgent: bool = False) -> None:
        calls.append(("send", user_id, subject, urgent))

    positional = send.publish(7, "hi")
    keywords = send.publish(user_id=8, subject="yo", urgent=True)
    mixed = send.publish(9, subject="mix")
    old_style = queue.publish("plain", [1])  # the callbacks= dict keeps working beside it
    assert stored(row_of(installed, positional)) == [7, "hi"]  # as queue.publish stores a list
    assert stored(row_of(installed, keywords)) == {"user_id": 8, "subject": "yo", "urgent": True}
    assert stored(row_of(installed, mixed)) == {"user_id": 9, "subject": "mix"}
    assert row_of(installed, positional)["callback_name"] == "send"
    queue.process()
    assert sorted(calls, key=str) == sorted(
        [("send", 7, "hi", False), ("send", 8, "yo", True), ("send", 9, "mix", False), ("plain", 1)], key=str
    )
    assert {state_of(installed, i) for i in (positional, keywords, mixed, old_style)} == {JobState.FINISHED}
    assert send(1, "direct") is None and calls[-1] == ("send", 1, "direct", False)  # still callable


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((1,), {}, "missing a required argument: 'subject'"),
        ((1, "a", "b"), {}, "too many positional arguments"),
        ((1, "a"), {"urgnt": True}, "unexpected keyword argument 'urgnt'"),
        ((1,), {"user_id": 2, "subject": "a"}, "multiple values for argument 'user_id'"),
    ],
)
def test_task_publish_with_wrong_arguments_is_a_publish_error_and_writes_nothing(
    make_queue, installed, args, kwargs, message
):
    queue = make_queue()

    @queue.task
    def send(user_id: int, subject: str, *, urgent: bool = False) -> None: ...

    with pytest.raises(PublishError, match=message):
        send.publish(*args, **kwargs)
    with pytest.raises(PublishError, match=message):
        send.configure(serial_group="g").publish(*args, **kwargs)
    assert count_rows(installed) == 0


def test_positional_only_or_star_args_mixed_with_keywords_cannot_be_stored(make_queue, installed):
    queue = make_queue()

    @queue.task
    def many(*items: int, tag: str = "") -> None: ...

    with pytest.raises(PublishError, match="all positionally or all by keyword"):
        many.publish(1, 2, tag="x")
    assert count_rows(installed) == 0
    assert stored(row_of(installed, many.publish(1, 2))) == [1, 2]


def test_decorator_options_and_configure_options_reach_the_row(make_queue, installed):
    queue = make_queue(priorities=[1, 2, 3])

    @queue.task(name="mailer", priority=3, queue="mail")
    def send(to: str) -> None: ...

    default = row_of(installed, send.publish("a@x"))
    assert (default["callback_name"], default["priority"], default["queue"]) == ("mailer", 3, "general_mail")
    chosen = send.configure(serial_group="user-7", priority=2, identifier="i1", postpone_by=60_000)
    row = row_of(installed, chosen.publish("b@x"))
    assert (row["serial_group"], row["priority"], row["identifier"]) == ("user-7", 2, "i1")
    assert row["postponed_by"] == 60_000
    with pytest.raises(PriorityError):
        send.configure(priority=9).publish("c@x")
    with pytest.raises(PublishError, match="coalesce_threshold"):
        send.configure(coalesce_threshold=3).publish("c@x")
    assert count_rows(installed) == 2


def test_registration_is_checked_and_needs_no_connection():
    queue = Queue(database_url="mysql+pymysql://nobody@127.0.0.1:1/never", callbacks={"taken": print})

    @queue.task
    def fine() -> None: ...

    assert queue.config.callbacks["fine"].func is fine.func
    assert not queue.store.opened  # registration only: nothing was connected
    with pytest.raises(ConfigError, match="already registered"):
        queue.task(name="taken")(fine.func)
    with pytest.raises(ConfigError, match="priority 5"):
        queue.task(name="p", priority=5)(fine.func)
    with pytest.raises(ConfigError, match="invalid queue"):
        queue.task(name="q", queue="no spaces")(fine.func)
    assert set(queue.config.callbacks) == {"taken", "fine"}


def test_a_task_registered_before_the_cli_rebuilds_the_config_is_kept(make_queue, installed):
    """`bgq --database` builds a new Config from the old one: registered tasks must stay."""
    queue = make_queue()

    @queue.task
    def kept() -> None: ...

    queue.config = type(queue.config)(**{**queue.config.__dict__, "database_url": installed.url})
    assert "kept" in queue.config.callbacks
    job_id = kept.publish()
    queue.process()
    assert state_of(installed, job_id) == JobState.FINISHED


# --- typing: mypy catches a wrong publish --------------------------------------------------------

GOOD = """
    import asyncio
    from bgq import Queue

    queue = Queue(database_url="postgresql+psycopg://nobody@127.0.0.1:1/never")


    @queue.task(name="send", priority=1)
    def send(user_id: int, subject: str, *, urgent: bool = False) -> None: ...


    @queue.task
    async def fetch(url: str) -> int:
        await asyncio.sleep(0)
        return 1


    a: int | None = send.publish(1, "hi")
    b: int | None = send.publish(user_id=1, subject="hi", urgent=True)
    c: int | None = send.configure(serial_group="g", priority=1, postpone_by=5).publish(1, "hi")
    send(1, "direct")


    async def main() -> None:
        d: int = await fetch.publish_async("https://example.org")
        e: int = await send.configure(identifier="x").publish_async(2, subject="s")
"""

BAD = """
    from bgq import Queue

    queue = Queue(database_url="postgresql+psycopg://nobody@127.0.0.1:1/never")


    @queue.task(name="send", priority=1)
    def send(user_id: int, subject: str, *, urgent: bool = False) -> None: ...


    @queue.task
    async def fetch(url: str) -> int:
        return 1


    send.publish(1)  # line 15
    send.publish("1", "hi")  # line 16
    send.publish(1, "hi", urgnt=True)  # line 17
    send.configure(serial_group=7).publish(1, "hi")  # line 18
    send.publish(1, "hi", serial_group="g")  # line 19


    async def main() -> None:
        await fetch.publish_async(3)  # line 23
"""


def test_mypy_catches_wrong_task_arguments_and_passes_right_ones(tmp_path: Path):
    (tmp_path / "good_tasks.py").write_text(textwrap.dedent(GOOD).lstrip())
    (tmp_path / "bad_tasks.py").write_text(textwrap.dedent(BAD).lstrip())
    (tmp_path / "mypy.ini").write_text("[mypy]\n")
    out, err, _ = mypy.api.run(
        [
            "--strict", "--config-file", str(tmp_path / "mypy.ini"), "--cache-dir", str(tmp_path / "cache"),
            "--no-error-summary", "--show-error-codes", str(tmp_path / "good_tasks.py"),
            str(tmp_path / "bad_tasks.py"),
        ]
    )  # fmt: skip
    assert err == ""
    errors: dict[int, list[str]] = {}
    for line in out.splitlines():
        assert "good_tasks.py" not in line, out  # the right uses type-check cleanly
        if "bad_tasks.py:" in line and ": error:" in line:
            errors.setdefault(int(line.split(":")[1]), []).append(line.split(": error: ")[1])
    expected = {
        15: 'Missing positional argument "subject" in call to "publish" of "Task"',
        16: 'Argument 1 to "publish" of "Task" has incompatible type "str"; expected "int"',
        17: 'Unexpected keyword argument "urgnt" for "publish" of "Task"',
        18: 'Argument "serial_group" to "configure" of "Task" has incompatible type "int"',
        19: 'Unexpected keyword argument "serial_group" for "publish" of "Task"',
        23: 'Argument 1 to "publish_async" of "Task" has incompatible type "int"; expected "str"',
    }
    for line, message in expected.items():
        assert any(message in e for e in errors.get(line, [])), (line, message, out)
    assert set(errors) == set(expected), out
