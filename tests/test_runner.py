"""bgq.jobs.callback: backoff, the classification of a job's exception (SPEC B §6), the hooks of a run."""

from __future__ import annotations

import os

import pytest

import bgq.jobs.callback
from bgq import (
    DieException,
    JobState,
    PermanentErrorException,
    SkipException,
    TemporaryErrorException,
    WaitingException,
)
from bgq.config import build_config
from bgq.jobs.callback import backoff_ms, classify, describe, invoke, memory_usage, run
from tests.support.clock import FakeTime

MINUTE = 60_000


def noop(*args, **kwargs):
    return None


def config(**options):
    options.setdefault("callbacks", {"noop": noop})
    options.setdefault("database_url", "mysql+pymysql://nobody@127.0.0.1:1/never")
    return build_config(**options)


class CustomPermanent(PermanentErrorException):
    pass


# --- backoff (checklist 30, 31) ---


@pytest.mark.parametrize(
    ("attempts", "expected"),
    [
        (0, 30_000),
        (1, 1 * MINUTE),
        (2, 2 * MINUTE),
        (3, 4 * MINUTE),
        (4, 8 * MINUTE),
        (5, 16 * MINUTE),
        (6, 16 * MINUTE),
        (7, 16 * MINUTE),
    ],
)
def test_checklist_31_backoff_sequence(attempts, expected):
    assert backoff_ms(attempts) == expected
    assert type(backoff_ms(attempts)) is int


@pytest.mark.parametrize("attempts", [1000, 1024, 1025, 5000, 2**31 - 1])
def test_checklist_31_backoff_is_capped_for_large_attempt_counts(attempts):
    """A temporary failure retries for ever (every 16 min: attempt 1025 comes after ~11 days)."""
    assert backoff_ms(attempts) == 16 * MINUTE


# --- classify ---


def test_checklist_34_skip_is_finished_with_its_message():
    outcome = classify(SkipException("nothing to do"), 1, config())
    assert outcome.state is JobState.FINISHED
    assert outcome.error == "nothing to do"
    assert outcome.postponed_by is None
    assert (outcome.clone, outcome.die) == (False, False)


def test_skip_without_message_stores_its_class_name():
    assert classify(SkipException(), 1, config()).error == "SkipException"


def test_checklist_35_waiting_is_finished_and_cloned():
    outcome = classify(WaitingException("not yet"), 2, config())
    assert outcome.state is JobState.FINISHED
    assert outcome.error == "not yet"
    assert outcome.clone is True
    assert outcome.die is False
    assert outcome.postponed_by is None


@pytest.mark.parametrize("exc", [PermanentErrorException("gone"), CustomPermanent("gone")])
def test_checklist_28_permanent_error(exc):
    outcome = classify(exc, 1, config())
    assert outcome.state is JobState.PERMANENTLY_FAILED
    assert outcome.error == "gone"
    assert outcome.exception is exc
    assert (outcome.clone, outcome.die) == (False, False)
    assert outcome.postponed_by is None


def test_checklist_36_bare_die_is_permanent_and_stops_the_worker():
    outcome = classify(DieException("stop"), 1, config())
    assert outcome.state is JobState.PERMANENTLY_FAILED
    assert outcome.die is True
    assert outcome.error == "stop"


def _die_from(cause: BaseException) -> DieException:
    try:
        raise DieException() from cause
    except DieException as exc:
        return exc


def test_checklist_37_die_with_a_cause_is_classified_by_the_cause():
    outcome = classify(_die_from(ValueError("flaky")), 3, config())
    assert outcome.state is JobState.TEMPORARILY_FAILED
    assert outcome.die is True
    assert outcome.postponed_by == backoff_ms(3) == 4 * MINUTE
    assert outcome.error == "ValueError: flaky"
    assert isinstance(outcome.exception, ValueError)


@pytest.mark.parametrize(
    ("cause", "state", "clone"),
    [
        (PermanentErrorException("p"), JobState.PERMANENTLY_FAILED, False),
        (TypeError("t"), JobState.PERMANENTLY_FAILED, False),
        (SkipException("s"), JobState.FINISHED, False),
        (WaitingException("w"), JobState.FINISHED, True),
        (TemporaryErrorException("t"), JobState.TEMPORARILY_FAILED, False),
    ],
)
def test_checklist_37_die_cause_kinds(cause, state, clone):
    outcome = classify(_die_from(cause), 1, config())
    assert outcome.state is state
    assert outcome.clone is clone
    assert outcome.die is True


def test_die_with_only_an_implicit_context_is_bare():
    """`raise DieException()` inside an except block has a __context__, not a cause."""
    try:
        try:
            raise ValueError("inner")
        except ValueError:
            raise DieException("stop")  # noqa: B904
    except DieException as exc:
        outcome = classify(exc, 1, config())
    assert outcome.state is JobState.PERMANENTLY_FAILED
    assert outcome.die is True


@pytest.mark.parametrize(
    "exc",
    [
        TypeError("f() takes 1 positional argument but 2 were given"),
        AttributeError("'NoneType' object has no attribute 'x'"),
        NameError("name 'x' is not defined"),
        ZeroDivisionError("division by zero"),
        ImportError("No module named 'x'"),
        ModuleNotFoundError("No module named 'y'"),
        UnboundLocalError("local variable"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_checklist_29_programming_errors_are_permanent(exc):
    outcome = classify(exc, 1, config())
    assert outcome.state is JobState.PERMANENTLY_FAILED
    assert outcome.die is False
    assert outcome.postponed_by is None
    assert outcome.error == f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("attempt", [0, 1, 2, 5, 9])
@pytest.mark.parametrize(
    "exc",
    [Exception("boom"), RuntimeError("boom"), KeyError("k"), OSError("io"), TemporaryErrorException("later")],
    ids=lambda e: type(e).__name__,
)
def test_checklist_30_other_errors_are_temporary_with_backoff(exc, attempt):
    outcome = classify(exc, attempt, config())
    assert outcome.state is JobState.TEMPORARILY_FAILED
    assert outcome.postponed_by == backoff_ms(attempt)
    assert outcome.die is False
    assert outcome.clone is False
    assert outcome.exception is exc


def test_permanent_errors_are_configurable():
    cfg = config(permanent_errors=(KeyError,))
    assert classify(KeyError("k"), 1, cfg).state is JobState.PERMANENTLY_FAILED
    assert classify(TypeError("t"), 1, cfg).state is JobState.TEMPORARILY_FAILED
    # the library's own exceptions keep their meaning whatever the list says
    assert classify(PermanentErrorException("p"), 1, cfg).state is JobState.PERMANENTLY_FAILED
    assert classify(SkipException("s"), 1, cfg).state is JobState.FINISHED


def test_describe():
    assert describe(ValueError("bad")) == "ValueError: bad"
    assert describe(ValueError()) == "ValueError"
    assert describe(PermanentErrorException("bad")) == "bad"
    assert describe(TemporaryErrorException()) == "TemporaryErrorException"


# --- invoke (checklist 21) ---


def test_checklist_21_invoke_spreads_lists_and_dicts():
    def f(a, b, c=None):
        return (a, b, c)

    assert invoke(f, [1, 2]) == (1, 2, None)
    assert invoke(f, (1, 2, 3)) == (1, 2, 3)
    assert invoke(f, {"b": 2, "a": 1}) == (1, 2, None)
    assert invoke(f, {"c": 3, "b": 2, "a": 1}) == (1, 2, 3)
    assert invoke(lambda: "none", []) == "none"


# --- run ---


def test_run_success_reports_time_and_memory(monkeypatch):
    calls, fake = [], FakeTime()
    monkeypatch.setattr(bgq.jobs.callback, "time", fake)

    def callback(a, b):
        calls.append((a, b))
        fake.advance(0.02)  # a callback that takes 20 ms

    outcome = run(callback, [1, "x"], 1, config())
    assert calls == [(1, "x")]
    assert outcome.state is JobState.FINISHED
    assert outcome.error is None
    assert outcome.exception is None
    assert isinstance(outcome.execution_time, int)
    assert outcome.execution_time >= 20
    assert set(outcome.memory) == {"before", "after"}
    for key in ("before", "after"):
        assert set(outcome.memory[key]) == {"rss", "peak_rss"}
        assert isinstance(outcome.memory[key]["rss"], int)
        assert outcome.memory[key]["rss"] > 0


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux /proc only")
def test_memory_is_read_afresh_each_time_and_the_peak_is_per_job():
    """The /proc files stay open between calls: each call still sees the current figures, and
    the reset makes the next peak the job's own."""
    memory_usage(reset_peak=True)
    block = bytearray(64 * 1024 * 1024)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    grown = memory_usage()
    del block
    shrunk = memory_usage()
    reset = memory_usage(reset_peak=True)
    assert grown["rss"] is not None and shrunk["rss"] is not None and reset["peak_rss"] is not None
    assert grown["rss"] >= shrunk["rss"] + 32 * 1024 * 1024
    assert shrunk["peak_rss"] >= grown["rss"] - 4 * 1024 * 1024  # the peak outlives the block
    assert reset["peak_rss"] < grown["rss"] - 32 * 1024 * 1024  # until the reset


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_reads_its_own_memory():
    memory_usage()  # the parent's files are open
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its /proc/self is not the parent's
        os.close(read)
        files = bgq.jobs.callback._proc_files()
        os.write(write, b"ok" if {os.getpid(): files} == bgq.jobs.callback._PROC_FILES else b"no")
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 2) == b"ok"
    os.close(read)
    assert memory_usage()["rss"] is not None


def test_run_passes_dict_as_keyword_arguments():
    seen = {}

    def callback(*, to, subject):
        seen.update(to=to, subject=subject)

    assert run(callback, {"subject": "Hi", "to": "a@b"}, 1, config()).state is JobState.FINISHED
    assert seen == {"to": "a@b", "subject": "Hi"}


@pytest.mark.parametrize(
    ("parameters", "why"),
    [([1, 2, 3], "too many positional"), ({"nope": 1}, "unknown keyword"), ([], "missing argument")],
)
def test_checklist_29_wrong_arguments_are_permanent(parameters, why):
    def callback(a):
        return a

    outcome = run(callback, parameters, 1, config())
    assert outcome.state is JobState.PERMANENTLY_FAILED, why
    assert outcome.error.startswith("TypeError: ")


def test_run_maps_a_callback_exception_with_the_attempt_backoff():
    def callback():
        raise RuntimeError("db down")

    outcome = run(callback, [], 4, config())
    assert outcome.state is JobState.TEMPORARILY_FAILED
    assert outcome.postponed_by == 8 * MINUTE
    assert outcome.error == "RuntimeError: db down"
    assert outcome.execution_time is None


def test_checklist_38_on_error_receives_exception_and_parameters():
    seen = []
    original = CustomPermanent("no")

    def callback(x):
        raise original

    outcome = run(callback, [7], 1, config(on_error=lambda e, p: seen.append((e, p))))
    assert seen == [(original, [7])]
    assert outcome.state is JobState.PERMANENTLY_FAILED  # on_error returned: the original counts


def test_checklist_38_on_error_exception_replaces_the_job_exception():
    """SPEC B §6 'process with on error exception': a permanent error, replaced by a plain one."""

    def callback():
        raise CustomPermanent("permanent")

    def on_error(exc, parameters):
        raise Exception("from on_error")

    outcome = run(callback, [], 2, config(on_error=on_error))
    assert outcome.state is JobState.TEMPORARILY_FAILED
    assert outcome.error == "Exception: from on_error"
    assert outcome.postponed_by == 2 * MINUTE


def test_checklist_38_on_error_can_turn_a_temporary_error_permanent():
    def callback():
        raise RuntimeError("x")

    def on_error(exc, parameters):
        raise PermanentErrorException("escalated") from exc

    outcome = run(callback, [], 1, config(on_error=on_error))
    assert outcome.state is JobState.PERMANENTLY_FAILED
    assert outcome.error == "escalated"


def test_on_error_not_called_on_success():
    seen = []
    outcome = run(noop, [], 1, config(on_error=lambda e, p: seen.append(e)))
    assert outcome.state is JobState.FINISHED
    assert seen == []


def test_checklist_39_hooks_receive_the_parameters_in_order():
    events = []
    cfg = config(
        on_before_process=lambda p: events.append(("before", p)),
        on_after_process=lambda p: events.append(("after", p)),
    )

    def callback(**kwargs):
        events.append(("callback", kwargs))

    outcome = run(callback, {"a": 1}, 1, cfg)
    assert outcome.state is JobState.FINISHED
    assert events == [("before", {"a": 1}), ("callback", {"a": 1}), ("after", {"a": 1})]


@pytest.mark.parametrize(
    ("exc", "state"),
    [
        (RuntimeError("hook"), JobState.TEMPORARILY_FAILED),
        (TypeError("hook"), JobState.PERMANENTLY_FAILED),
        (PermanentErrorException("hook"), JobState.PERMANENTLY_FAILED),
        (SkipException("hook"), JobState.FINISHED),
    ],
    ids=lambda v: type(v).__name__,
)
def test_checklist_39_on_before_process_error_is_classified_and_skips_the_callback(exc, state):
    called = []
    errors = []

    def before(parameters):
        raise exc

    outcome = run(
        lambda *a: called.append(a),
        [1],
        3,
        config(on_before_process=before, on_error=lambda e, p: errors.append(e)),
    )
    assert called == []
    assert outcome.state is state
    assert errors == [exc]
    if state is JobState.TEMPORARILY_FAILED:
        assert outcome.postponed_by == backoff_ms(3)


@pytest.mark.parametrize(
    ("exc", "state"),
    [
        (RuntimeError("hook"), JobState.TEMPORARILY_FAILED),
        (AttributeError("hook"), JobState.PERMANENTLY_FAILED),
        (PermanentErrorException("hook"), JobState.PERMANENTLY_FAILED),
    ],
    ids=lambda v: type(v).__name__,
)
def test_checklist_39_on_after_process_error_is_classified_like_a_callback_error(exc, state):
    called = []
    errors = []

    def after(parameters):
        assert parameters == {"x": 1}
        raise exc

    outcome = run(
        lambda **k: called.append(k),
        {"x": 1},
        1,
        config(on_after_process=after, on_error=lambda e, p: errors.append(e)),
    )
    assert called == [{"x": 1}]
    assert outcome.state is state
    assert errors == [exc]


def test_on_after_process_not_called_when_the_callback_fails():
    after = []

    def callback():
        raise RuntimeError("x")

    outcome = run(callback, [], 1, config(on_after_process=lambda p: after.append(p)))
    assert outcome.state is JobState.TEMPORARILY_FAILED
    assert after == []


def test_die_from_callback_sets_die_flag_through_run():
    def callback():
        raise DieException() from RuntimeError("stop after this")

    outcome = run(callback, [], 1, config())
    assert outcome.die is True
    assert outcome.state is JobState.TEMPORARILY_FAILED


def test_base_exceptions_are_not_swallowed():
    """KeyboardInterrupt / SystemExit are the worker's to handle, not a job outcome."""

    def callback():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(callback, [], 1, config())


def test_checklist_30_run_survives_a_very_high_attempt_number():
    """A job that has failed 1025 times still gets an outcome (the 16-minute cap), not a crash."""

    def callback():
        raise RuntimeError("still down")

    outcome = run(callback, [], 1025, config())
    assert outcome.state is JobState.TEMPORARILY_FAILED
    assert outcome.postponed_by == 16 * MINUTE
