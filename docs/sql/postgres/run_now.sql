-- bgq background_job_run_now, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_run_now(p_id, p_reason, p_now)
--   p_id      the job to run without waiting for its postponement.
--   p_reason  who and why (appended to error_message as a line 'Run now: <reason>', so the
--             error of a job in backoff stays readable above it).
--   p_now     the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: one row (id, queue, priority, previous_state); the job keeps its state (READY or
--   TEMPORARILY_FAILED) and is due at once: postponed_by is cleared, updated_at = p_now. In
--   broker mode the caller publishes the id (the claim is exactly-once, so the message that was
--   already waiting in its delay queue is harmless).
-- The console's "run now": a job that has not started (READY with a publish postponement, or
--   TEMPORARILY_FAILED in its backoff) skips the rest of its wait. A grouped job keeps its
--   (priority, id) place in its group; the claim still decides when it runs.
-- Locks: the job row only.
-- Fencing: refuses any other state (PROCESSING belongs to its worker; WAITING waits for its
--   group, not for a postponement; finished jobs need a requeue).
-- Errors: SQLSTATE BQ001 no such job; SQLSTATE BQ003 the job is not READY or TEMPORARILY_FAILED
--   (as every error in PostgreSQL, it aborts the caller's transaction).
-- Idempotent: yes (a job that is due stays due; only the message and updated_at change).
-- Transaction: never commits (a function cannot). From a console:
--   BEGIN; SELECT * FROM background_job_run_now(42, 'alice: the SMTP server is back', NULL); COMMIT;
CREATE OR REPLACE FUNCTION background_job_run_now(
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
    v_state SMALLINT;
BEGIN
    SELECT j.state INTO v_state FROM background_job AS j WHERE j.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'bgq: no such job' USING ERRCODE = 'BQ001';
    END IF;
    IF v_state NOT IN (1, 4) THEN
        RAISE EXCEPTION 'bgq: only a READY or TEMPORARILY_FAILED job can run now (state %)', v_state
        USING ERRCODE = 'BQ003';
    END IF;

    UPDATE background_job AS j
    SET postponed_by = NULL,
        error_message = CASE
            WHEN j.error_message IS NULL THEN 'Run now: ' || COALESCE(p_reason, '')
            ELSE j.error_message || E'\n' || 'Run now: ' || COALESCE(p_reason, '')
        END,
        updated_at = v_now
    WHERE j.id = p_id;

    RETURN QUERY
    SELECT j.id, j.queue, j.priority, v_state
    FROM background_job AS j
    WHERE j.id = p_id;
END;
$$;
