"""Periodic jobs: declared in code, stored in {table}_schedule, each fire time published once.

A schedule is a cron expression (5 fields, or 6 with seconds first), read in an IANA time zone
by croniter (DST-aware), and the job each fire publishes. Every `bgq work`, `bgq consume` and
`bgq process` calls `Scheduler.tick()` from its loop (at most once per TICK_SECONDS, and at the
next fire time of a schedule it declares: an idle worker waits at most until then): the first
tick upserts the declared schedules and deactivates the queue's schedules the code no longer
declares; every tick reads the due schedules with the database's clock and calls
`{table}_fire` per fire time, whose primary key on (schedule, fire time) lets exactly one
worker publish it however many race.

Missed fires (no worker ran at a fire time, or it ran later than `grace`): policy 'once' (the
default) publishes one catch-up job, for the latest missed fire time; 'skip' publishes nothing
for them. Fire times within `grace` of now always publish, each its own job.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..config import Config
from ..errors import ConfigError, PriorityError, SerializationError, UnknownCallbackError
from ..model import JobRef, Message, ScheduleRow
from ..sql import retry
from ..sql.database import Store
from .sender import Sender
from .validate import MAX_TEXT

TICK_SECONDS = 1.0  # a worker loop fires schedules at most this often, and at each fire time
FIRE_MARGIN = 0.02  # s after a fire time before its tick, so the database's clock has passed it too
DEFAULT_GRACE = 60.0  # s a fire may be late and still count as on time (not missed)
MISSED_POLICIES = ("once", "skip")
_MAX_ON_TIME = 100  # fire times within grace published per schedule per tick at most
_TINY = dt.timedelta(microseconds=1)


def _croniter() -> Any:
    try:
        from croniter import croniter
    except ImportError as exc:  # the optional extra is missing
        raise ConfigError("Schedules need croniter: pip install 'bgq[schedules]'.") from exc
    return croniter


@dataclass(frozen=True)
class Schedule:
    """A schedule as declared in code (validated when declared)."""

    name: str
    cron: str
    callback_name: str
    parameters_json: str
    queue: str
    serial_group: str | None
    priority: int
    timezone: str
    missed: str
    grace: float

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def next_after(self, after: dt.datetime) -> dt.datetime:
        """The first fire time strictly after `after`, in UTC. In the hour the clocks go back, a
        fire time whose wall-clock time repeats the previous one is skipped (a daily 02:30 job
        runs once), unless the hour field is a wildcard (an hourly job runs every hour)."""
        local = after.astimezone(self.zone)
        it = _croniter()(self.cron, local, second_at_beginning=True)
        found: dt.datetime = it.get_next(dt.datetime)
        if not self._hour_wildcard():
            while found.replace(tzinfo=None) <= local.replace(tzinfo=None):  # the repeated hour
                found = it.get_next(dt.datetime)
        return found.astimezone(dt.UTC)

    def previous_before(self, before: dt.datetime) -> dt.datetime:
        """The last fire time strictly before `before`, in UTC."""
        it = _croniter()(self.cron, before.astimezone(self.zone), second_at_beginning=True)
        found: dt.datetime = it.get_prev(dt.datetime)
        return found.astimezone(dt.UTC)

    def _hour_wildcard(self) -> bool:
        fields = self.cron.split()
        hour = fields[2] if len(fields) == 6 else fields[1]
        return "*" in hour

    def plan(self, next_fire_at: dt.datetime, now: dt.datetime) -> tuple[list[dt.datetime], dt.datetime]:
        """(the fire times to publish, in order; the next fire time after `now`) for a schedule
        whose stored next fire time is `next_fire_at` <= `now`."""
        on_time_from = now - dt.timedelta(seconds=self.grace)
        publish: list[dt.datetime] = []
        if next_fire_at < on_time_from and self.missed == "once":
            publish.append(max(next_fire_at, self.previous_before(on_time_from)))
        at = max(next_fire_at, on_time_from) - _TINY
        while len(publish) < _MAX_ON_TIME:
            at = self.next_after(at)
            if at > now:
                break
            publish.append(at)
        return publish, self.next_after(now)


def declare(
    config: Config,
    name: str,
    cron: str,
    callback_name: str,
    parameters: Any = None,
    *,
    serial_group: str | None = None,
    priority: int | None = None,
    timezone: str = "UTC",
    missed: str = "once",
    grace: float | dt.timedelta = DEFAULT_GRACE,
) -> Schedule:
    """Validate a schedule as a publish would validate its job; ConfigError/PublishError subclasses."""
    if not isinstance(name, str) or not name or len(name) > MAX_TEXT:
        raise ConfigError(f"A schedule's name must be a non-empty string of at most {MAX_TEXT} characters.")
    if not isinstance(cron, str):
        raise ConfigError(f"Schedule {name!r}: cron must be a string.")
    if len(cron.split()) not in (5, 6) or not _croniter().is_valid(cron, second_at_beginning=True):
        raise ConfigError(
            f"Schedule {name!r}: {cron!r} is not a cron expression of 5 fields (minute hour day month "
            "weekday) or 6 (seconds first)."
        )
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ConfigError(f"Schedule {name!r}: unknown time zone {timezone!r}.") from None
    if missed not in MISSED_POLICIES:
        raise ConfigError(f"Schedule {name!r}: missed must be 'once' or 'skip', got {missed!r}.")
    grace_s = grace.total_seconds() if isinstance(grace, dt.timedelta) else grace
    if isinstance(grace_s, bool) or not isinstance(grace_s, int | float) or grace_s < 0:
        raise ConfigError(f"Schedule {name!r}: grace must be a non-negative number of seconds.")
    spec = config.callbacks.get(callback_name)
    if spec is None:
        raise UnknownCallbackError(f'Schedule {name!r}: callback "{callback_name}" is not configured.')
    chosen = priority if priority is not None else (spec.priority or config.priorities[0])
    if chosen not in config.priorities:
        raise PriorityError(
            f"Schedule {name!r}: priority {chosen!r} is not one of {list(config.priorities)}."
        )
    if serial_group is not None and (not isinstance(serial_group, str) or not serial_group):
        raise ConfigError(f"Schedule {name!r}: serial_group must be a non-empty string.")
    if serial_group is not None and len(serial_group) > MAX_TEXT:
        raise ConfigError(f"Schedule {name!r}: serial_group is over {MAX_TEXT} characters.")
    try:
        parameters_json = json.dumps([] if parameters is None else parameters)
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"Schedule {name!r}: parameters must be JSON ({exc}).") from None
    if not isinstance([] if parameters is None else parameters, list | tuple | dict):
        raise SerializationError(f"Schedule {name!r}: parameters must be a list, a tuple or a dict.")
    return Schedule(
        name=name, cron=cron, callback_name=callback_name, parameters_json=parameters_json,
        queue=config.queue_name(spec.queue), serial_group=serial_group, priority=chosen,
        timezone=timezone, missed=missed, grace=float(grace_s),
    )  # fmt: skip


class Scheduler:
    """One queue's schedules: the declared ones (`specs`, owned by the Queue, so a rebuilt
    Scheduler keeps them), synced to the table on the first tick, fired by `tick()`."""

    def __init__(self, config: Config, store: Store, sender: Sender, specs: Mapping[str, Schedule]) -> None:
        self.config = config
        self.store = store
        self.sender = sender
        self.specs = specs
        self.synced = False
        self.last_tick = float("-inf")
        self.next_fire = float("inf")  # time.monotonic() of the next fire of a declared schedule

    def tick(self) -> list[JobRef]:
        """What a worker loop calls: sync (first time) and fire the due schedules, at most once
        per TICK_SECONDS and at each fire time of a declared schedule (so a fire is late by about
        FIRE_MARGIN, not by up to a second plus the loop's idle wait). Never raises: a failure is
        logged and the next tick tries again."""
        now = time.monotonic()
        if now - self.last_tick < TICK_SECONDS and now < self.next_fire:
            return []
        self.last_tick = now
        try:
            if not self.synced:
                self.sync()
            return self.fire_due()
        except Exception as exc:  # a database error, or a stored cron this croniter cannot read
            self.config.logger.warning(f"bgq: Firing schedules failed; the next tick retries. ({exc})")
            return []
        finally:
            self.next_fire = self._next_fire()

    def wait_bound(self) -> float:
        """Seconds an idle worker loop may wait before its next tick is due (inf: no schedule)."""
        return max(0.0, self.next_fire - time.monotonic())

    def _next_fire(self) -> float:
        """time.monotonic() of the next fire time of the schedules this process declares."""
        if not self.specs:
            return float("inf")
        try:
            utc = dt.datetime.now(dt.UTC)
            soonest = min(spec.next_after(utc) for spec in self.specs.values())
        except Exception:  # croniter missing or refusing: the once-a-second tick still runs
            return float("inf")
        return time.monotonic() + (soonest - utc).total_seconds() + FIRE_MARGIN

    def sync(self, now: dt.datetime | None = None) -> int:
        """Upsert every declared schedule; deactivate the queue's schedules not declared (how many)."""
        procs = self.store.procs
        with self.store.database.transaction() as conn:
            clock = now or dt.datetime.now(dt.UTC)  # only the first fire time comes from it
            for s in self.specs.values():
                procs.schedule_upsert(
                    conn, s.name, s.cron, s.timezone, s.callback_name, s.parameters_json, s.queue,
                    s.serial_group, s.priority, s.missed, s.next_after(clock), now,
                )  # fmt: skip
            retired = procs.schedule_retire(conn, self.config.queue, sorted(self.specs), now)
        self.synced = True
        return retired

    def fire_due(self, now: dt.datetime | None = None) -> list[JobRef]:
        """Publish the jobs of every due schedule of this queue (its sub-queues too), each fire
        time once across all workers; `now` (UTC) replaces the database's clock (tests)."""
        procs = self.store.procs
        due = retry.in_transaction(
            self.store.database, lambda conn: procs.schedules(conn, self.config.queue, True, now)
        )
        published: list[JobRef] = []
        for row in due:
            published.extend(self._fire(row, now))
        if published:
            self.sender.send([Message(j.id, j.queue, j.priority) for j in published])
        return published

    def _fire(self, row: ScheduleRow, now: dt.datetime | None) -> list[JobRef]:
        spec = self.specs.get(row.name) or _from_row(row)
        clock = now or row.now
        assert row.next_fire_at is not None  # a due schedule has one
        times, following = spec.plan(row.next_fire_at, clock)
        out: list[JobRef] = []
        for i, fire_at in enumerate(times):
            nxt = times[i + 1] if i + 1 < len(times) else following
            job = self._fire_once(row.name, fire_at, nxt, now)
            log = self.config.logger
            if job is not None:
                out.append(job)
                log.info(f"bgq: Schedule {row.name} fired for {fire_at.isoformat()}: job {job.id}.")
            else:
                log.info(
                    f"bgq: Schedule {row.name} for {fire_at.isoformat()} was published by another worker."
                )
        if not times:  # every due fire was missed and skipped: only move on
            self._fire_once(row.name, None, following, now)
        return out

    def _fire_once(
        self, name: str, fire_at: dt.datetime | None, next_at: dt.datetime, now: dt.datetime | None
    ) -> JobRef | None:
        """{table}_fire in a transaction of its own, run again on a deadlock: a fire time another
        worker (or this call's lost commit) took already gives None, so nothing is published twice."""
        procs = self.store.procs
        return retry.in_transaction(
            self.store.database, lambda conn: procs.fire(conn, name, fire_at, next_at, now)
        )

    def rows(self) -> list[ScheduleRow]:
        """Every schedule in the table (all queues), for `bgq schedules`."""
        with self.store.database.transaction() as conn:
            return self.store.procs.schedules(conn, None, False)


def _from_row(row: ScheduleRow) -> Schedule:
    """A schedule this process does not declare (another process's sub-queue): fire it as stored."""
    return Schedule(
        name=row.name, cron=row.cron, callback_name=row.callback_name,
        parameters_json=json.dumps(row.parameters_json), queue=row.queue,
        serial_group=row.serial_group, priority=row.priority, timezone=row.timezone,
        missed=row.missed, grace=DEFAULT_GRACE,
    )  # fmt: skip
