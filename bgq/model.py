"""bgq's domain types, shared by every part: job states and modes, a job, a claim, an outcome, a result."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any, NamedTuple

# --- states and modes (mirroring the CHECK constraints of db/<dialect>/schema.sql) ---


class JobState(IntEnum):
    BACK_TO_BROKER = -1
    READY = 1
    PROCESSING = 2
    FINISHED = 3
    TEMPORARILY_FAILED = 4
    PERMANENTLY_FAILED = 5
    WAITING = 6
    REDUNDANT = 7
    BROKER_FAILED = 8


#: States a claim accepts ("ready to process").
CLAIMABLE = frozenset(
    {
        JobState.BACK_TO_BROKER,
        JobState.READY,
        JobState.TEMPORARILY_FAILED,
        JobState.WAITING,
        JobState.BROKER_FAILED,
    }
)
#: States after which a job never runs again by itself.
TERMINAL = frozenset({JobState.FINISHED, JobState.REDUNDANT, JobState.PERMANENTLY_FAILED})


class Mode(StrEnum):
    NORMAL = "normal"
    UNIQUE = "unique"
    RECURRING = "recurring"


# --- a job on its way: published, claimed, run, written (procedure rows as bgq/sql/calls.py reads them) ---


@dataclass(frozen=True)
class NewJob:
    queue: str
    priority: int
    callback_name: str
    parameters_json: str | None
    parameters: bytes | None
    serial_group: str | None
    coalesce_threshold: int | None
    identifier: str | None
    mode: str
    postponed_by: int | None
    processed_by_broker: bool


@dataclass(frozen=True)
class ClaimResult:
    outcome: str  # claimed | waiting | redundant | locked | missing | skipped | unexpected
    attempt: int | None
    state: int | None
    predecessor_id: int | None
    promoted_id: int | None
    callback_name: str | None
    parameters_json: Any
    parameters: bytes | None
    queue: str | None
    priority: int | None
    serial_group: str | None
    identifier: str | None
    mode: str | None
    coalesce_threshold: int | None


@dataclass(frozen=True)
class Claimed:
    """A job that {table}_claim_batch or {table}_hand_off claimed for the caller: its id and its claim."""

    id: int
    claim: ClaimResult


@dataclass(frozen=True)
class Outcome:
    """What a job's run amounts to, ready for the finish procedure."""

    state: JobState
    error: str | None = None
    postponed_by: int | None = None
    execution_time: int | None = None
    memory: dict[str, Any] | None = None
    exception: BaseException | None = None
    die: bool = False  # the worker stops before its next job
    clone: bool = False  # WaitingException: a fresh copy runs after waiting_job_expiration


@dataclass(frozen=True)
class JobResult:
    """One job's result for {table}_finish_results, through finish_batch or hand_off (state 1
    READY gives back an unstarted job; clone_delay_ms: a RECURRING job's successor or a
    WaitingException's copy, due after that many ms)."""

    id: int
    attempt: int
    state: int
    error: str | None = None
    postponed_by: int | None = None
    execution_time: int | None = None
    memory: dict[str, Any] | None = None
    clone_delay_ms: int | None = None


@dataclass(frozen=True)
class FinishResult:
    finished: bool
    promoted_id: int | None
    promoted_queue: str | None
    promoted_priority: int | None
    clone_id: int | None = None


class Message(NamedTuple):
    """What the broker needs to deliver a job: its id, queue, priority and delay (ms; None: at once)."""

    id: int
    queue: str
    priority: int
    delay_ms: int | None = None


@dataclass(frozen=True)
class JobRef:
    """A job to act on: its id, state, queue and priority (due jobs, promotions, requeues)."""

    id: int
    state: int | None
    queue: str
    priority: int


@dataclass(frozen=True)
class GroupHead:
    serial_group: str
    id: int
    priority: int


@dataclass(frozen=True)
class Reaped:
    """A job the reaper took back from a dead or silent worker: TEMPORARILY_FAILED (to run
    again), or REDUNDANT when its attempt had been cancelled."""

    id: int
    queue: str
    priority: int
    pid: int | None
    stalled_since: dt.datetime
    state: JobState


@dataclass(frozen=True)
class StuckJobs:
    """One row of the monitor: a state, how many jobs are stuck in it, and since when."""

    state: int
    job_count: int
    oldest_since: dt.datetime | None


# --- workers and metrics (bgq/modes/registry.py, bgq/metrics.py) ---


class WorkerMode(StrEnum):
    """The command a registered worker runs (mirroring {table}_worker's mode CHECK)."""

    WORK = "work"
    CONSUME = "consume"
    PROCESS = "process"


@dataclass(frozen=True)
class WorkerRow:
    """One row of {table}_worker: a running (or dead, not yet reaped) worker process."""

    id: int
    host: str
    pid: int
    mode: str
    queue: str
    started_at: dt.datetime
    last_heartbeat_at: dt.datetime
    current_job_id: int | None
    jobs_done: int
    version: str


@dataclass(frozen=True)
class TableStats:
    """What the metrics read from the tables at scrape time (bgq/sql/calls.py table_stats)."""

    now: dt.datetime  # the server's clock
    jobs: list[tuple[str, int, int, dt.datetime]]  # (queue, state, count, oldest created_at)
    groups_blocked: dict[str, int]  # queue -> serial groups held up behind a failed job
    workers: dict[str, int]  # mode -> registered workers


# --- control: pauses, cancels, heartbeats, schedules (migration 0004_control) ---


@dataclass(frozen=True)
class Pause:
    """A paused queue or serial group ({table}_pauses)."""

    kind: str  # "queue" or "group"
    name: str
    reason: str | None
    paused_by: str | None
    paused_at: dt.datetime


@dataclass(frozen=True)
class Cancelled:
    """What {table}_cancel did: outcome 'cancelled', 'abort_requested' or 'finished'."""

    outcome: str
    state: int
    promoted_id: int | None
    queue: str
    priority: int


@dataclass(frozen=True)
class Beat:
    """A heartbeat's answer: whether the claim still holds, and whether a cancel asks to stop."""

    alive: bool
    abort_requested: bool
    reason: str | None


@dataclass(frozen=True)
class ScheduleRow:
    """One row of {table}_schedules."""

    name: str
    cron: str
    timezone: str
    callback_name: str
    parameters_json: Any
    queue: str
    serial_group: str | None
    priority: int
    missed: str
    active: bool
    next_fire_at: dt.datetime | None
    last_fire_at: dt.datetime | None
    last_job_id: int | None
    last_job_state: int | None
    now: dt.datetime
