"""Contract of {table}_unfinished_identifiers: distinct identifiers of the queue's jobs still to run."""

from __future__ import annotations

import json

import pytest

from tests.support.helpers import new_job, procs, set_row

TERMINAL = (3, 5, 7)
UNFINISHED = (-1, 1, 2, 4, 6, 8)


def unfinished(installed, identifiers=None, *, queue="general", exclude_processing=False, raw=None):
    payload = raw if raw is not None else (None if identifiers is None else json.dumps(identifiers))
    with installed.db.transaction() as conn:
        return procs(installed).unfinished_identifiers(conn, queue, payload, exclude_processing)


def job_in(installed, job_state, identifier, queue="general"):
    job = new_job(installed, identifier=identifier, queue=queue)
    set_row(installed, job, state=job_state)
    return job


def test_checklist_44_terminal_states_are_finished_every_other_state_is_not(installed):
    for job_state in (*TERMINAL, *UNFINISHED):
        job_in(installed, job_state, f"s{job_state}")
    assert unfinished(installed) == sorted(f"s{s}" for s in UNFINISHED)


def test_checklist_44_exclude_processing_leaves_out_processing_jobs(installed):
    for job_state in (*TERMINAL, *UNFINISHED):
        job_in(installed, job_state, f"s{job_state}")
    assert unfinished(installed, exclude_processing=True) == sorted(f"s{s}" for s in UNFINISHED if s != 2)
    assert unfinished(installed, ["s2", "s1"], exclude_processing=True) == ["s1"]
    assert unfinished(installed, ["s2", "s1"], exclude_processing=False) == ["s1", "s2"]


def test_checklist_44_an_identifier_with_one_unfinished_job_among_finished_ones_is_unfinished(installed):
    job_in(installed, 3, "mixed")
    job_in(installed, 5, "mixed")
    job_in(installed, 1, "mixed")
    job_in(installed, 3, "done")
    job_in(installed, 7, "done")
    assert unfinished(installed) == ["mixed"]
    assert unfinished(installed, ["mixed", "done"]) == ["mixed"]


def test_checklist_44_a_permanently_failed_job_no_longer_counts(installed):
    """[final]: PERMANENTLY_FAILED is terminal (v5.5.1 counted it as unfinished for ever)."""
    job_in(installed, 5, "recurring-job")
    assert unfinished(installed) == []


@pytest.mark.parametrize("empty", [None, "[]"])
def test_checklist_45_no_identifiers_means_every_distinct_non_null_identifier(installed, empty):
    job_in(installed, 1, "b")
    job_in(installed, 4, "a")
    job_in(installed, 6, "b")
    job_in(installed, 2, "c")
    job_in(installed, 1, None)
    job_in(installed, 8, None)
    assert unfinished(installed, raw=empty) == ["a", "b", "c"]


def test_checklist_45_identifiers_filter_keeps_only_those_asked_for(installed):
    for identifier in ("a", "b", "c", "d"):
        job_in(installed, 1, identifier)
    assert unfinished(installed, ["d", "b", "zz"]) == ["b", "d"]
    assert unfinished(installed, ["zz"]) == []
    assert unfinished(installed, ["b", "b"]) == ["b"]


def test_identifiers_are_compared_exactly_and_ordered_byte_wise(installed):
    for identifier in ("b", "B", "a", "é", "a-1", "A"):
        job_in(installed, 1, identifier)
    assert unfinished(installed) == ["A", "B", "a", "a-1", "b", "é"]
    assert unfinished(installed, ["A", "é"]) == ["A", "é"]
    assert unfinished(installed, ["e"]) == []


def test_checklist_9_only_the_queue_and_its_sub_queues(installed):
    job_in(installed, 1, "mine")
    job_in(installed, 1, "sub", queue="general_x")
    job_in(installed, 1, "other", queue="other")
    job_in(installed, 1, "lookalike", queue="generalx")
    assert unfinished(installed) == ["mine", "sub"]
    assert unfinished(installed, ["other", "lookalike", "sub"]) == ["sub"]
    assert unfinished(installed, queue="other") == ["other"]
    assert unfinished(installed, queue="general_x") == ["sub"]


def test_quotes_and_backslashes_in_identifiers_survive_the_json_array(installed):
    odd = ['it\'s "x"', "back\\slash", "per%cent_"]
    for identifier in odd:
        job_in(installed, 1, identifier)
    job_in(installed, 1, "perXcentY")
    assert unfinished(installed, odd) == sorted(odd)


def test_is_read_only(installed):
    job = job_in(installed, 2, "x")
    before = installed.sql("SELECT * FROM {t} WHERE id = %s", (job,))
    unfinished(installed)
    unfinished(installed, ["x"], exclude_processing=True)
    assert installed.sql("SELECT * FROM {t} WHERE id = %s", (job,)) == before
