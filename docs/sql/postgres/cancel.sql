-- bgq background_job_cancel, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_cancel(p_id, p_reason, p_now)
--   p_id      the job to cancel.
--   p_reason  why (stored as error_message 'Cancelled: <reason>').
--   p_now     the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: one row (outcome, state, promoted_id, queue, priority):
--   outcome  'cancelled'        the job had not started (-1, 1, 4, 6, 8): it is REDUNDANT now
--                               (finished_at = p_now) and its group moves on;
--            'abort_requested'  the job is PROCESSING: abort_requested_at = p_now. Its worker's
--                               next heartbeat (background_job_heartbeat) reports the abort, the
--                               callback gets bgq.JobAborted, and the worker writes REDUNDANT
--                               with this message (fenced on its claim as every result);
--            'finished'         FINISHED, PERMANENTLY_FAILED or REDUNDANT already: nothing changed.
--   state        the job's state after the call.
--   promoted_id  a job of the group this call moved WAITING -> READY (publish it, broker mode).
--   queue, priority  the job's.
-- Locks: the group row (a grouped job), then the job row, as background_job_requeue.
-- Fencing: every write is conditional on the state read under the locks; a PROCESSING job's
--   updated_at is not touched (the reaper still judges its worker's liveness by it).
-- Errors: SQLSTATE BQ001 no such job. Idempotent: yes (a second call finds REDUNDANT:
--   'finished'; a second abort request moves abort_requested_at only).
-- Transaction: never commits (a function cannot). From a console:
--   BEGIN; SELECT * FROM background_job_cancel(42, 'customer left', NULL); COMMIT;
CREATE OR REPLACE FUNCTION background_job_cancel(
    p_id BIGINT,
    p_reason TEXT,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    outcome TEXT,
    state SMALLINT,
    promoted_id BIGINT,
    queue VARCHAR,
    priority INTEGER
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_group VARCHAR;
    v_state SMALLINT;
    v_outcome TEXT;
    v_promoted BIGINT;
BEGIN
    SELECT j.serial_group INTO v_group FROM background_job AS j WHERE j.id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'bgq: no such job' USING ERRCODE = 'BQ001';
    END IF;
    IF v_group IS NOT NULL THEN
        INSERT INTO background_job_group (serial_group, updated_at) VALUES (v_group, v_now)
        ON CONFLICT (serial_group) DO UPDATE SET updated_at = EXCLUDED.updated_at;
    END IF;
    SELECT j.state INTO v_state FROM background_job AS j WHERE j.id = p_id FOR UPDATE;

    IF v_state IN (-1, 1, 4, 6, 8) THEN
        UPDATE background_job AS j
        SET state = 7,
            error_message = 'Cancelled: ' || COALESCE(p_reason, ''),
            postponed_by = NULL,
            finished_at = v_now,
            updated_at = v_now
        WHERE j.id = p_id AND j.state IN (-1, 1, 4, 6, 8);
        v_outcome := 'cancelled';
        IF v_group IS NOT NULL THEN
            v_promoted := background_job_group_wake(v_group, v_now);
        END IF;
    ELSIF v_state = 2 THEN
        UPDATE background_job AS j
        SET abort_requested_at = v_now,
            error_message = 'Cancelled: ' || COALESCE(p_reason, '')
        WHERE j.id = p_id AND j.state = 2;
        v_outcome := 'abort_requested';
    ELSE
        v_outcome := 'finished';
    END IF;

    RETURN QUERY
    SELECT v_outcome, j.state, v_promoted, j.queue, j.priority
    FROM background_job AS j
    WHERE j.id = p_id;
END;
$$;
