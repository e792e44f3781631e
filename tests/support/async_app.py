"""The application of the coroutine tests: `bgq --app tests.async_app:queue process|work|consume`.

Its callbacks and hooks are all `async def`. Each writes a ledger row (tests/work_app.py's
ledger: `event`, `token`, `pid`, and in `grp` the id of the event loop it ran on), so a test
reads which process ran what on which loop. Configured by environment variables:
  BGQ_TEST_WORK_URL, BGQ_TEST_WORK_TABLE, BGQ_TEST_WORK_LEDGER   as for tests/work_app.py
  BGQ_TEST_ASYNC_AMQP, BGQ_TEST_ASYNC_QUEUE                      broker mode: RabbitMQ URL, queue
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from bgq import Queue
from tests.support.work_app import write


def loop_id() -> str:
    return str(id(asyncio.get_running_loop()))


async def before(parameters: Any) -> None:
    await asyncio.sleep(0)
    write("before", str(parameters[0]), loop_id())


async def after(parameters: Any) -> None:
    await asyncio.sleep(0)
    write("after", str(parameters[0]), loop_id())


async def on_error(exc: BaseException, parameters: Any) -> None:
    await asyncio.sleep(0)
    write("error", str(parameters[0]), loop_id())


async def metadata(parameters: Any) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"loop": loop_id(), "pid": os.getpid()}


def queue() -> Queue:
    amqp = os.environ.get("BGQ_TEST_ASYNC_AMQP")
    producer = None
    if amqp:
        from bgq.broker.rabbitmq import RabbitMQ

        producer = RabbitMQ(amqp)
    built = Queue(
        database_url=os.environ["BGQ_TEST_WORK_URL"],
        table_name=os.environ["BGQ_TEST_WORK_TABLE"],
        queue=os.environ.get("BGQ_TEST_ASYNC_QUEUE", "general"),
        priorities=[1, 2],
        producer=producer,
        on_before_process=before,
        on_after_process=after,
        on_error=on_error,
        on_processing_get_metadata=metadata,
    )

    @built.task
    async def greet(token: str) -> None:
        await asyncio.sleep(0)  # suspends once on the process's event loop
        write("run", token, loop_id())

    @built.task
    async def fail(token: str) -> None:
        await asyncio.sleep(0)
        raise ValueError(f"failed {token}")

    return built
