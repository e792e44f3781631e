"""RECURRING jobs and WaitingException: a fresh copy, made by the finish procedure (checklists 35, 41-43)."""

from __future__ import annotations

import pytest

from bgq import JobState, PermanentErrorException, SkipException, WaitingException


def _rows(installed, identifier=None):
    if identifier is None:
        return installed.sql("SELECT * FROM {t} ORDER BY id")
    return installed.sql("SELECT * FROM {t} WHERE identifier = %s ORDER BY id", (identifier,))


def _raiser(exc):
    def callback(*args, **kwargs):
        raise exc

    return callback


@pytest.mark.parametrize("identifier", [None, "report-7"])
def test_checklist_35_waiting_exception_finishes_and_clones(make_queue, installed, identifier):
    """The clone has attempts 0 and postponed_by = waiting_job_expiration; Part A #8: it is made for
    a job with an identifier too, and it keeps coalesce_threshold."""
    queue = make_queue(callbacks={"wait": _raiser(WaitingException("not yet"))}, waiting_job_expiration=1500)
    job = queue.publish(
        "wait", {"x": 1}, identifier=identifier, serial_group="g", coalesce_threshold=9, priority=1
    )
    queue.process_job(job)
    original, clone = _rows(installed)
    assert (original["id"], original["state"], original["error_message"]) == (
        job,
        JobState.FINISHED,
        "not yet",
    )
    assert clone["state"] == JobState.READY and clone["number_of_attempts"] == 0
    assert clone["postponed_by"] == 1500 and clone["coalesce_threshold"] == 9
    assert (clone["callback_name"], clone["serial_group"], clone["identifier"]) == ("wait", "g", identifier)
    assert str(clone["parameters_json"]).replace(" ", "") in ('{"x":1}', "{'x':1}")


def test_checklist_41_42_recurring_job_leaves_exactly_one_row(make_queue, installed, caplog):
    runs = []
    queue = make_queue(callbacks={"tick": lambda: runs.append(1)})
    job = queue.publish("tick", identifier="tick", mode="recurring")
    assert queue.process_job(job) == "claimed"
    (row,) = _rows(installed, "tick")
    assert row["id"] != job and row["state"] == JobState.READY and row["mode"] == "recurring"
    assert row["postponed_by"] == 1000
    assert queue.process_job(job) == "missing"  # the old id again: silent no-op
    assert runs == [1] and caplog.records == []


def test_checklist_41_recurring_job_is_not_cloned_when_an_unfinished_one_exists(make_queue, installed):
    queue = make_queue(callbacks={"tick": lambda: None})
    first = queue.publish("tick", identifier="tick", mode="recurring")
    second = queue.publish("tick", identifier="tick", mode="recurring")
    queue.process_job(first)
    assert [r["id"] for r in _rows(installed, "tick")] == [second]


def test_recurring_job_is_rescheduled_after_a_skip(make_queue, installed):
    queue = make_queue(callbacks={"tick": _raiser(SkipException("nothing new"))})
    job = queue.publish("tick", identifier="tick", mode="recurring")
    queue.process_job(job)
    (row,) = _rows(installed, "tick")
    assert row["id"] != job and row["state"] == JobState.READY


def test_checklist_43_permanently_failed_recurring_job_stops(make_queue, installed):
    queue = make_queue(callbacks={"tick": _raiser(PermanentErrorException("broken"))})
    job = queue.publish("tick", identifier="tick", mode="recurring")
    queue.process_job(job)
    (row,) = _rows(installed, "tick")
    assert (row["id"], row["state"]) == (job, JobState.PERMANENTLY_FAILED)
    unfinished = installed.sql(
        "SELECT COUNT(*) AS n FROM {t} WHERE identifier = 'tick' AND state NOT IN (3, 5, 7)"
    )
    assert unfinished[0]["n"] == 0


def test_temporarily_failed_recurring_job_retries_itself_without_a_clone(make_queue, installed):
    queue = make_queue(callbacks={"tick": _raiser(RuntimeError("down"))})
    job = queue.publish("tick", identifier="tick", mode="recurring")
    queue.process_job(job)
    assert [(r["id"], r["state"]) for r in _rows(installed, "tick")] == [(job, JobState.TEMPORARILY_FAILED)]


def test_clone_is_sent_delayed_in_broker_mode(broker_queue, rabbit, installed):
    queue = broker_queue(callbacks={"wait": _raiser(WaitingException("later"))})
    job = queue.publish("wait")
    rabbit.purge()
    queue.process_job(job)
    clone = [r for r in _rows(installed) if r["id"] != job][0]
    assert rabbit.bodies(f"{rabbit.base}_1_1000") == [str(clone["id"])]
