"""Schedules: each fire time published once by racing worker processes; DST, missed fires, sync, CLI."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

import bgq
import bgq.jobs.schedules
from bgq.model import JobState
from tests.support.cli import BGQ, run_bgq
from tests.support.clock import Clock, fake_time
from tests.support.helpers import wait_until

ROOT = Path(__file__).resolve().parent.parent
UTC = dt.UTC


def _jobs(installed, callback: str) -> list[dict]:
    return installed.sql("SELECT * FROM {t} WHERE callback_name = %s ORDER BY id", (callback,))


def _fired(installed, name: str) -> list[dict]:
    rows = installed.sql("SELECT * FROM {t}_fired WHERE schedule_name = %s ORDER BY fire_at", (name,))
    for r in rows:
        for k in ("fire_at", "fired_at"):
            r[k] = r[k].replace(tzinfo=UTC) if r[k].tzinfo is None else r[k].astimezone(UTC)
    return rows


@pytest.fixture
def clean_schedules(installed):
    yield
    installed.sql("DELETE FROM {t}_schedule")
    installed.sql("DELETE FROM {t}_fired")


@pytest.mark.slow
def test_each_fire_time_is_published_once_by_four_racing_workers_on_two_hosts(
    installed, clean_schedules, capsys, tmp_path
):
    """4 `bgq work` processes (2 per "host") for 12 s on a schedule firing every 2 s."""
    env = {
        **os.environ,
        "BGQ_TEST_SCHED_URL": installed.url,
        "BGQ_TEST_SCHED_TABLE": installed.table,
        "PYTHONPATH": str(ROOT),
    }
    workers = [
        subprocess.Popen(
            [BGQ, "--app", "tests.support.schedule_app:queue", "-v", "work", "--poll", "0.2"],
            env={**env, "BGQ_TEST_SCHED_HOST": host},
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / f"worker{i}.log").open("w"),
        )
        for i, host in enumerate(("host-a", "host-a", "host-b", "host-b"))
    ]
    try:
        # the workers start (imports, install check) on a busy machine
        wait_until(lambda: _fired(installed, "every2s"), "a worker to fire the schedule", 90, 0.2)
        # 12 s of four workers racing, from the first fire on: 6 more fire times
        wait_until(lambda: len(_fired(installed, "every2s")) >= 7, "seven fire times", 60, 0.2)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(timeout=30)
        errors = [(tmp_path / f"worker{i}.log").read_text() for i in range(len(workers))]
    assert all(w.returncode == 0 for w in workers), errors

    fired = _fired(installed, "every2s")
    jobs = _jobs(installed, "tick")
    times = [r["fire_at"] for r in fired]
    assert len(times) >= 6  # the first one, then one every 2 s for 12 s
    assert len(set(times)) == len(times)
    assert sorted(r["job_id"] for r in fired) == [j["id"] for j in jobs]  # one job per fire time
    assert all((b - a) == dt.timedelta(seconds=2) for a, b in zip(times, times[1:], strict=False))
    assert all(t.second % 2 == 0 and t.microsecond == 0 for t in times)
    late = [(r["fired_at"] - r["fire_at"]).total_seconds() for r in fired]
    # Each worker's log: the fire times it published, and those another worker had published.
    won = sum(e.count("every2s fired for") for e in errors)
    lost = sum(e.count("was published by another worker") for e in errors)
    assert won == len(times)  # every published fire time was published by exactly one call
    with capsys.disabled():
        print(
            f"\n[fire once, {installed.db.dialect.name}] 4 workers, 2 hosts, 12 s: {len(times)} fire times, "
            f"{len(jobs)} jobs, {len(set(times))} distinct; fire calls {won + lost} ({won} won, {lost} lost "
            f"the race); lateness max {max(late):.2f} s, "
            f"mean {sum(late) / len(late):.2f} s"
        )
    assert max(late) < 3.0  # a tick per second per worker, on a loaded 2-core machine
    assert {j["state"] for j in jobs[:-1]} == {JobState.FINISHED}  # and the workers ran them


def test_a_daily_schedule_in_a_timezone_fires_once_a_day_across_both_dst_changes(
    make_queue, installed, clean_schedules
):
    """Europe/Prague 02:30: on 2026-03-29 02:30 does not exist (fires at 03:00 local, once); on
    2026-10-25 it exists twice (fires once, at the first). The clock is injected."""
    queue = make_queue(callbacks={"nightly": lambda: None})
    queue.schedule("nightly", "30 2 * * *", "nightly", timezone="Europe/Prague")
    fired = []
    for start in (dt.datetime(2026, 3, 27, 12, tzinfo=UTC), dt.datetime(2026, 10, 23, 12, tzinfo=UTC)):
        installed.sql("DELETE FROM {t}_schedule")
        queue.scheduler.sync(start)
        now = start
        while now < start + dt.timedelta(days=4):
            now += dt.timedelta(minutes=15)
            if queue.scheduler.fire_due(now):  # (<table>_fired keeps a day of rows: read them as they come)
                fired.append(_fired(installed, "nightly")[-1]["fire_at"])
    assert fired == [
        dt.datetime(2026, 3, 28, 1, 30, tzinfo=UTC),  # 02:30 CET
        dt.datetime(2026, 3, 29, 1, 0, tzinfo=UTC),  # 03:00 CEST: 02:30 was skipped by the clocks
        dt.datetime(2026, 3, 30, 0, 30, tzinfo=UTC),  # 02:30 CEST
        dt.datetime(2026, 3, 31, 0, 30, tzinfo=UTC),
        dt.datetime(2026, 10, 24, 0, 30, tzinfo=UTC),  # 02:30 CEST
        dt.datetime(2026, 10, 25, 0, 30, tzinfo=UTC),  # the first 02:30 only (CEST), not 01:30 UTC
        dt.datetime(2026, 10, 26, 1, 30, tzinfo=UTC),  # 02:30 CET
        dt.datetime(2026, 10, 27, 1, 30, tzinfo=UTC),
    ]
    assert len(_jobs(installed, "nightly")) == len(fired)


def test_an_hourly_schedule_fires_every_real_hour_on_the_day_the_clocks_go_back(
    make_queue, installed, clean_schedules
):
    queue = make_queue(callbacks={"hourly": lambda: None})
    queue.schedule("hourly", "0 * * * *", "hourly", timezone="Europe/Prague")
    start = dt.datetime(2026, 10, 24, 22, 0, 30, tzinfo=UTC)  # 00:00:30 local on the 25th
    queue.scheduler.sync(start)
    now = start
    while now < dt.datetime(2026, 10, 25, 23, tzinfo=UTC):  # 00:00 local on the 26th
        now += dt.timedelta(minutes=10)
        queue.scheduler.fire_due(now)
    # 01:00 .. 23:00 local and 00:00 on the 26th, with 02:00 twice: 25 real hours (the fired rows
    # of the last day are all kept, and there is one job per fire time).
    fired = _fired(installed, "hourly")
    assert len(fired) == len(_jobs(installed, "hourly")) == 25
    local = [r["fire_at"].astimezone(ZoneInfo("Europe/Prague")) for r in fired]
    assert [t.hour for t in local].count(2) == 2  # 02:00 CEST and 02:00 CET


@pytest.mark.parametrize("policy, expected", [("once", [8, 10]), ("skip", [10])])
def test_missed_fires_after_a_stop_follow_the_schedules_policy(
    make_queue, installed, clean_schedules, policy, expected
):
    queue = make_queue(callbacks={"job": lambda: None})
    queue.schedule("every2", "*/2 * * * * *", "job", missed=policy, grace=1)
    t0 = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    queue.scheduler.sync(t0 + dt.timedelta(seconds=0.1))  # next fire: t0 + 2 s
    queue.scheduler.fire_due(t0 + dt.timedelta(seconds=2.2))  # on time
    queue.scheduler.fire_due(t0 + dt.timedelta(seconds=4.3))  # on time
    # The workers stop; they come back at t0 + 10.5 s: 6 and 8 were missed, 10 is on time.
    published = queue.scheduler.fire_due(t0 + dt.timedelta(seconds=10.5))
    fired = [int((r["fire_at"] - t0).total_seconds()) for r in _fired(installed, "every2")]
    assert fired == [2, 4, *expected]
    assert len(published) == len(expected)
    (row,) = [r for r in queue.schedules() if r.name == "every2"]
    assert row.next_fire_at == t0 + dt.timedelta(seconds=12)
    assert row.last_job_id == published[-1].id
    assert queue.scheduler.fire_due(t0 + dt.timedelta(seconds=10.9)) == []  # nothing is due twice


def test_a_fire_time_is_published_once_however_often_it_is_fired(make_queue, installed, clean_schedules):
    """The procedure itself: a second call for the same fire time (another worker's) publishes nothing."""
    queue = make_queue()
    queue.schedule("s", "* * * * *", "noop")
    t = dt.datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    queue.scheduler.sync(t - dt.timedelta(seconds=30))
    with queue.database.transaction() as conn:
        first = queue.procs.fire(conn, "s", t, t + dt.timedelta(minutes=1), t)
    with queue.database.transaction() as conn:
        again = queue.procs.fire(conn, "s", t, t + dt.timedelta(minutes=1), t)
    assert first is not None and again is None
    assert [j["id"] for j in _jobs(installed, "noop")] == [first.id]
    with queue.database.transaction() as conn:  # an old read cannot move next_fire_at back
        queue.procs.fire(conn, "s", None, t - dt.timedelta(minutes=5), t)
    (row,) = queue.schedules()
    assert row.next_fire_at == t + dt.timedelta(minutes=1)


def test_a_deadlock_while_firing_fires_again_and_publishes_once(
    make_queue, installed, clean_schedules, monkeypatch
):
    """A deadlock (on Galera a lost certification) in reading the due schedules or in firing one
    runs that step again: the fire time is published once, and the pass is not lost to it."""
    queue = make_queue()
    queue.schedule("s", "* * * * *", "noop")
    t = dt.datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    queue.scheduler.sync(t - dt.timedelta(seconds=30))
    failed: list[str] = []
    for name in ("schedules", "fire"):
        real = getattr(queue.procs, name)

        def once(*args, _real=real, _name=name, **kwargs):
            if _name not in failed:
                failed.append(_name)
                raise bgq.DeadlockError("Deadlock found when trying to get lock")
            return _real(*args, **kwargs)

        monkeypatch.setattr(queue.procs, name, once)
    (job,) = queue.scheduler.fire_due(t + dt.timedelta(seconds=1))
    assert failed == ["schedules", "fire"]
    assert [j["id"] for j in _jobs(installed, "noop")] == [job.id]


def test_schedules_are_stored_at_worker_start_and_removed_ones_deactivated(
    make_queue, installed, clean_schedules
):
    queue = make_queue(callbacks={"a": lambda: None, "b": lambda: None}, priorities=[1, 5])
    queue.schedule("a", "0 3 * * *", "a", {"x": 1}, serial_group="nightly", priority=5)
    queue.schedule("b", "*/5 * * * *", "b")
    queue.scheduler.tick()  # what every worker loop does
    rows = {r.name: r for r in queue.schedules()}
    assert set(rows) == {"a", "b"} and all(r.active for r in rows.values())
    a = rows["a"]
    assert (a.cron, a.timezone, a.callback_name, a.parameters_json, a.serial_group, a.priority) == (
        "0 3 * * *", "UTC", "a", {"x": 1}, "nightly", 5,
    )  # fmt: skip
    assert a.next_fire_at is not None and a.next_fire_at.hour == 3

    # A new deploy without "b": its worker deactivates it; declaring it again reactivates it.
    redeployed = make_queue(callbacks={"a": lambda: None, "b": lambda: None}, priorities=[1, 5])
    redeployed.schedule("a", "0 3 * * *", "a", {"x": 1}, serial_group="nightly", priority=5)
    assert redeployed.scheduler.sync() == 1
    rows = {r.name: r for r in redeployed.schedules()}
    assert (rows["a"].active, rows["b"].active) == (True, False)
    assert redeployed.scheduler.fire_due(dt.datetime(2030, 1, 1, tzinfo=UTC)) != []  # "a" only
    assert {j["callback_name"] for j in installed.sql("SELECT callback_name FROM {t}")} == {"a"}


def test_bad_schedules_are_refused_before_anything_is_stored(make_queue, installed, clean_schedules):
    queue = make_queue(callbacks={"job": lambda: None})
    with pytest.raises(bgq.ConfigError):
        queue.schedule("x", "61 * * * *", "job")
    with pytest.raises(bgq.ConfigError):
        queue.schedule("x", "* * *", "job")
    with pytest.raises(bgq.ConfigError):
        queue.schedule("x", "* * * * *", "job", timezone="Mars/Olympus")
    with pytest.raises(bgq.ConfigError):
        queue.schedule("x", "* * * * *", "job", missed="twice")
    with pytest.raises(bgq.UnknownCallbackError):
        queue.schedule("x", "* * * * *", "nope")
    with pytest.raises(bgq.PriorityError):
        queue.schedule("x", "* * * * *", "job", priority=9)
    with pytest.raises(bgq.SerializationError):
        queue.schedule("x", "* * * * *", "job", {"when": object()})
    queue.scheduler.sync()
    assert queue.schedules() == []


def test_the_decorator_form_declares_the_function_as_the_callback(make_queue, installed, clean_schedules):
    ran = []
    queue = make_queue()

    @queue.schedule("report", "*/10 * * * * *", parameters={"kind": "daily"})
    def report(kind):
        ran.append(kind)

    assert report.__name__ == "report"  # returned unchanged
    queue.scheduler.sync(dt.datetime(2026, 12, 1, 12, 0, 1, tzinfo=UTC))
    (job,) = queue.scheduler.fire_due(dt.datetime(2026, 12, 1, 12, 0, 10, 500, tzinfo=UTC))
    assert queue.process_job(job.id) == "claimed"  # (process() would tick with the real clock)
    assert ran == ["daily"]


def test_cli_schedules_pause_resume_cancel_and_monitor(make_queue, installed, clean_schedules):
    env = {"BGQ_TEST_SCHED_URL": installed.url, "BGQ_TEST_SCHED_TABLE": installed.table}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_bgq("--app", "tests.support.schedule_app:queue", *args, env=env, pythonpath=ROOT, cwd=ROOT)

    app = make_queue(queue="sched", callbacks={"tick": lambda host=None: None})  # as tests/schedule_app.py
    app.schedule("every2s", "*/2 * * * * *", "tick")
    try:
        app.fire_schedules()  # stores "every2s"
        (listed,) = json.loads(cli("schedules", "--json").stdout)
        assert (listed["name"], listed["cron"], listed["active"]) == ("every2s", "*/2 * * * * *", True)
        assert listed["next_fire_at"] is not None
        assert "every2s" in cli("schedules").stdout

        assert cli("pause", "sched", "--reason", "deploy").stdout.strip() == "paused queue sched"
        assert cli("pause", "--group", "g1", "--reason", "customer move").returncode == 0
        monitor = json.loads(cli("monitor", "--json").stdout)
        assert {(p["kind"], p["name"], p["reason"]) for p in monitor["paused"]} == {
            ("queue", "sched", "deploy"), ("group", "g1", "customer move"),
        }  # fmt: skip
        assert "paused group g1" in cli("monitor").stdout
        assert cli("pause", "sched").returncode == 2  # --reason is required
        assert cli("resume", "sched").stdout.strip() == "resumed queue sched"
        assert cli("resume", "--group", "g1").stdout.strip() == "resumed group g1"
        # QUEUE as `bgq work QUEUE` reads it: a sub-queue by its own name or by its full one.
        assert cli("pause", "mail", "--reason", "x").stdout.strip() == "paused queue sched_mail"
        assert cli("resume", "sched_mail").stdout.strip() == "resumed queue sched_mail"
        for bad, says in (
            (("pause", "bad queue!", "--reason", "x"), "Invalid sub-queue 'bad queue!'"),
            (("pause", "mailx", "--group", "g", "--reason", "x"), "not both"),
            (("pause", "--group", "g1 ", "--reason", "x"), "must not end with whitespace"),
        ):
            refused = cli(*bad)
            assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1, refused.stderr
            assert says in refused.stderr, refused.stderr
        assert json.loads(cli("monitor", "--json").stdout)["paused"] == []

        job = app.publish("tick")
        out = cli("cancel", str(job), "--reason", "not needed")
        assert out.returncode == 0 and "cancelled" in out.stdout
        assert installed.sql("SELECT state FROM {t} WHERE id = %s", (job,))[0]["state"] == JobState.REDUNDANT
        assert cli("cancel", "999999999", "--reason", "x").returncode == 1
    finally:
        installed.sql("DELETE FROM {t}_paused")


def test_an_idle_worker_fires_each_schedule_at_its_time_not_a_poll_later(
    make_queue, installed, clean_schedules
):
    """An idle `bgq work` waits at most until the next fire time of a schedule it declares, so with
    grace=1 and missed="skip" (the README's example) no on-time fire is lost: each is published
    within a fraction of a second of its time. (Ticks once a second plus the idle wait came up to
    about 1.3 s late, and a fire more than `grace` late was skipped.)"""
    from tests.test_work import Worker

    queue = make_queue(callbacks={"beat": lambda: None})
    queue.schedule("every2s", "*/2 * * * * *", "beat", missed="skip", grace=1)
    worker = Worker(queue, poll=1.0)  # bgq work's default poll
    worker.start()
    try:
        wait_until(lambda: len(_fired(installed, "every2s")) >= 5, "five fire times", 30, 0.1)
    finally:
        worker.finish()
    fired = _fired(installed, "every2s")
    times = [r["fire_at"] for r in fired]
    assert len(times) >= 4, times
    assert all((b - a) == dt.timedelta(seconds=2) for a, b in zip(times, times[1:], strict=False)), times
    late = [(r["fired_at"] - r["fire_at"]).total_seconds() for r in fired]
    print(f"\n[schedule lateness, idle worker, {installed.db.dialect.name}] max {max(late) * 1000:.0f} ms")
    assert max(late) < 0.5, late


def test_bgq_process_fires_due_schedules_and_runs_their_jobs_in_the_same_pass(
    make_queue, installed, clean_schedules, monkeypatch
):
    ran, clock, ticks = [], Clock(), fake_time(monkeypatch, bgq.jobs.schedules)
    queue = make_queue(callbacks={"beat": lambda: ran.append(time.time())}, clock=clock)
    queue.schedule("each-second", "* * * * * *", "beat")
    queue.process()  # stores the schedule (its first fire time is the next second)
    clock.advance(1.2)  # 1.2 s later, by bgq's clock and by the scheduler's tick clock
    ticks.advance(1.2)
    report = queue.process()  # a fresh cron run: its tick publishes, its claims pass runs it
    assert report.outcomes.get("claimed", 0) >= 1 and len(ran) >= 1
    assert {j["state"] for j in _jobs(installed, "beat")} == {JobState.FINISHED}


def test_bgq_consume_fires_due_schedules(broker_queue, rabbit, installed, clean_schedules):
    import threading

    from bgq.modes.consume import consume
    from bgq.modes.stopping import GracefulStop

    ran = []
    queue = broker_queue(callbacks={"beat": lambda: ran.append(time.time())})
    queue.schedule("each-second", "* * * * * *", "beat")
    stop = GracefulStop()
    consumer = threading.Thread(target=consume, args=(queue, None, 0, [1, 2, 3], stop), daemon=True)
    consumer.start()
    try:
        wait_until(lambda: len(ran) >= 2, "two fires consumed", 30, 0.1)
    finally:
        stop.requested = True
        consumer.join(15)
    assert len(ran) >= 2  # published by the consumer's ticks, sent to the broker, consumed
    fired = _fired(installed, "each-second")
    assert len({r["fire_at"] for r in fired}) == len(fired) == len(_jobs(installed, "beat"))
