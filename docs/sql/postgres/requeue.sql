-- bgq background_job_requeue, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_requeue(p_id, p_reason, p_now)
--   p_id      the job to run again.
--   p_reason  why (recorded as error_message 'Requeued: <reason>').
--   p_now     the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: one row (id, queue, priority, previous_state); the job is READY, due at once
--   (postponed_by and finished_at cleared, last_attempt_at kept, number_of_attempts kept so
--   the next claim's token is new). In broker mode the caller publishes the id.
-- The DBA's manual requeue: a PERMANENTLY_FAILED, REDUNDANT or FINISHED job (or one waiting for
--   its backoff) goes back to work. A grouped job takes its (priority, id) place in its group
--   again; the claim decides when it runs.
-- Locks: the group row (for a grouped job), then the job row.
-- Fencing: refuses a PROCESSING job (its worker still owns it; the reaper handles dead ones).
-- Errors: SQLSTATE BQ001 no such job; SQLSTATE BQ003 the job is PROCESSING (as every error in
--   PostgreSQL, it aborts the caller's transaction).
-- Idempotent: yes (a READY job stays READY; only the message and updated_at change).
-- Transaction: never commits (a function cannot). From a console:
--   BEGIN; SELECT * FROM background_job_requeue(42, 'fixed the SMTP password', NULL); COMMIT;
CREATE OR REPLACE FUNCTION background_job_requeue(
    p_id BIGINT,
    p_reason TEXT,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    id BIGINT,
    queue VARCHAR,
    priority INTEGER,
    previous_state SMALLINT
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_group VARCHAR;
    v_state SMALLINT;
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
    IF v_state = 2 THEN
        RAISE EXCEPTION 'bgq: the job is PROCESSING; its worker owns it' USING ERRCODE = 'BQ003';
    END IF;

    UPDATE background_job AS j
    SET state = 1,
        error_message = 'Requeued: ' || COALESCE(p_reason, ''),
        postponed_by = NULL,
        finished_at = NULL,
        updated_at = v_now
    WHERE j.id = p_id AND j.state <> 2;
    IF v_group IS NOT NULL THEN
        PERFORM background_job_group_wake(v_group, v_now);
    END IF;

    RETURN QUERY
    SELECT j.id, j.queue, j.priority, v_state
    FROM background_job AS j
    WHERE j.id = p_id;
END;
$$;
