"""What a worker loop drives: the parts of a queue (a Protocol that bgq.Queue satisfies).

The modes (work.py, consume.py and process.py beside this module) take any object with these
parts, so none of them imports bgq/queue.py, and bgq/queue.py can call them without an import cycle.
"""

from __future__ import annotations

from typing import Protocol

from ..config import Config
from ..jobs.executor import Executor
from ..jobs.reaper import Reaper
from ..jobs.schedules import Scheduler
from ..jobs.sender import Sender
from ..sql.database import Store


class Parts(Protocol):
    @property
    def config(self) -> Config: ...

    @property
    def store(self) -> Store: ...

    @property
    def sender(self) -> Sender: ...

    @property
    def executor(self) -> Executor: ...

    @property
    def reaper(self) -> Reaper: ...

    @property
    def scheduler(self) -> Scheduler: ...
