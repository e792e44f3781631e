"""`@queue.task`: a callback registered by decorator whose publish is typed by its own signature.

`Task[P, R]` is generic over the function's ParamSpec, so a type checker (the project's is mypy)
checks `task.publish(...)`'s arguments against the function, and publish checks them again at
run time with `inspect.Signature.bind` (a missing or unexpected argument is a PublishError,
before anything is written).

Publish options (serial_group, priority, ...) cannot share a signature with `P.kwargs` in a
type-safe way (a task's own parameter could be called `priority`), so, as procrastinate does
with `task.configure(...).defer(...)`, they go through `configure`:
`task.configure(serial_group="user-7", priority=2).publish(7, mail="x")`.

Parameters are stored the way `queue.publish` stores them, so the worker calls the function as
it calls any callback: only positional arguments are stored as a list, only keyword arguments
as a dict; a mix is stored as a dict, the positional ones named by the signature.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar

from .errors import PublishError
from .model import Mode

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

P = ParamSpec("P")
R = TypeVar("R")


class Publishing(Protocol):
    """What a task publishes through (bgq.Queue)."""

    def publish(
        self,
        callback_name: str,
        parameters: list[Any] | tuple[Any, ...] | dict[str, Any] | None = None,
        *,
        serial_group: str | None = None,
        identifier: str | None = None,
        mode: Mode | str = Mode.NORMAL,
        postpone_by: int | dt.timedelta | None = None,
        priority: int | None = None,
        coalesce_threshold: int | None = None,
        connection: Session | Connection | None = None,
    ) -> int | None: ...

    async def publish_async(
        self,
        callback_name: str,
        parameters: list[Any] | tuple[Any, ...] | dict[str, Any] | None = None,
        *,
        serial_group: str | None = None,
        identifier: str | None = None,
        mode: Mode | str = Mode.NORMAL,
        postpone_by: int | dt.timedelta | None = None,
        priority: int | None = None,
        coalesce_threshold: int | None = None,
    ) -> int: ...


class Task(Generic[P, R]):
    """A registered callback. Call it to run the function here; `publish` to queue a job of it."""

    def __init__(self, queue: Publishing, func: Callable[P, R], name: str) -> None:
        self.queue = queue
        self.func = func
        self.name = name
        self.signature = inspect.signature(func)
        functools.update_wrapper(self, func)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<bgq task {self.name!r}>"

    def publish(self, *args: P.args, **kwargs: P.kwargs) -> int | None:
        """Store a job that calls the function with these arguments; its id (None inside a bulk)."""
        return self.configure().publish(*args, **kwargs)

    async def publish_async(self, *args: P.args, **kwargs: P.kwargs) -> int:
        """`publish` for asyncio applications (Queue.publish_async)."""
        return await self.configure().publish_async(*args, **kwargs)

    def configure(
        self,
        *,
        serial_group: str | None = None,
        identifier: str | None = None,
        mode: Mode | str = Mode.NORMAL,
        postpone_by: int | dt.timedelta | None = None,
        priority: int | None = None,
        coalesce_threshold: int | None = None,
        connection: Session | Connection | None = None,
    ) -> Configured[P, R]:
        """The publish options of Queue.publish, for the next `.publish(...)` of this task."""
        options = {
            "serial_group": serial_group, "identifier": identifier, "mode": mode,
            "postpone_by": postpone_by, "priority": priority,
            "coalesce_threshold": coalesce_threshold, "connection": connection,
        }  # fmt: skip
        return Configured(self, options)

    def parameters(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any] | dict[str, Any]:
        """The stored form of a call's arguments, once they fit the signature (PublishError if not)."""
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise PublishError(f'Task "{self.name}": {exc}.') from None
        if not kwargs:
            return list(args)
        if not args:
            return dict(kwargs)
        named: dict[str, Any] = {}
        for param, value in zip(self.signature.parameters.values(), args, strict=False):
            if param.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
                raise PublishError(
                    f'Task "{self.name}": positional arguments for "{param.name}" cannot be stored '
                    "together with keyword arguments; pass them all positionally or all by keyword."
                )
            named[param.name] = value
        return {**named, **kwargs}


class Configured(Generic[P, R]):
    """A task with publish options chosen (`task.configure(...)`)."""

    def __init__(self, task: Task[P, R], options: dict[str, Any]) -> None:
        self.task = task
        self.options = options

    def publish(self, *args: P.args, **kwargs: P.kwargs) -> int | None:
        """Queue.publish of the task with these arguments and the configured options."""
        parameters = self.task.parameters(args, kwargs)
        return self.task.queue.publish(self.task.name, parameters, **self.options)

    async def publish_async(self, *args: P.args, **kwargs: P.kwargs) -> int:
        """Queue.publish_async of the task with these arguments and the configured options."""
        options = dict(self.options)
        if options.pop("connection") is not None:
            raise PublishError("publish_async takes no connection: it inserts and commits on its own.")
        parameters = self.task.parameters(args, kwargs)
        return await self.task.queue.publish_async(self.task.name, parameters, **options)
