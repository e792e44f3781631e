"""Runs coroutine callbacks and hooks from bgq's synchronous workers on one reused event loop per process.

A worker (`bgq process`, `bgq work`, `bgq consume`) runs one job at a time on its main thread. When
a callback or a hook returns an awaitable (an `async def` function was called), `resolve` runs it
to completion on that thread's event loop: created on first use, kept for the next job (so a
connection pool or client the application caches on the loop is reused), and created anew in a
forked child (`bgq work --concurrency N`), which must not share its parent's loop. No
`asyncio.run` per job: that would build and tear down a loop, and everything bound to it, each time.

The loop runs only while a coroutine of bgq's runs on it: a task a callback starts with
`asyncio.create_task` and does not await waits until the next coroutine job (await what you start).

If the calling thread is itself inside a running event loop (an asyncio application that calls
`queue.process()` from a coroutine), a second loop cannot run on it: the awaitable then runs on a
helper thread's loop (one per process, also reused) while the caller waits.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import os
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")

_local = threading.local()  # .loop, .pid: this thread's loop and the process that made it
_helper_lock = threading.Lock()
_helper: tuple[int, asyncio.AbstractEventLoop] | None = None  # (pid, loop running on a helper thread)


def resolve(value: Any) -> Any:
    """`value` itself; or, if it is awaitable (a coroutine function's result), its result once awaited."""
    if not inspect.isawaitable(value):
        return value
    return run(value)


def run(awaitable: Awaitable[T]) -> T:
    """Run `awaitable` to completion on this thread's reused loop and return its result (or raise)."""
    try:
        asyncio.get_running_loop()
        inside_a_loop = True
    except RuntimeError:
        inside_a_loop = False
    if inside_a_loop:
        return asyncio.run_coroutine_threadsafe(_wrap(awaitable), _helper_loop()).result()
    # (outside the except: an exception of the awaitable must not carry "no running event loop")
    return event_loop().run_until_complete(_wrap(awaitable))


def event_loop() -> asyncio.AbstractEventLoop:
    """This thread's event loop for callbacks: made on first use, reused, made anew after a fork."""
    loop: asyncio.AbstractEventLoop | None = getattr(_local, "loop", None)
    if loop is None or loop.is_closed() or getattr(_local, "pid", None) != os.getpid():
        loop = asyncio.new_event_loop()  # an inherited (forked) loop is left alone: its parent owns it
        _local.loop, _local.pid = loop, os.getpid()
        atexit.register(_close, loop, os.getpid())
    return loop


def _close(loop: asyncio.AbstractEventLoop, pid: int) -> None:
    """At exit: finish the loop's async generators and close it (in the process that made it)."""
    if os.getpid() != pid or loop.is_closed() or loop.is_running():
        return
    try:
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


async def _wrap(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _helper_loop() -> asyncio.AbstractEventLoop:
    """The loop of this process's helper thread, started on first use."""
    global _helper
    with _helper_lock:
        if _helper is None or _helper[0] != os.getpid() or _helper[1].is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="bgq-async-callbacks", daemon=True).start()
            _helper = (os.getpid(), loop)
        return _helper[1]
