-- bgq background_job_finish_batch, version 3 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_finish_batch(p_results, p_now)
--   p_results  JSON text: an array of results, each id at most once, as documented in
--              background_job_finish_results: {"id", "attempt", "state", "error", "postponed_by",
--              "execution_time", "memory", "clone_delay_ms"} (state 1 READY gives back a job
--              that was claimed but never started; clone_delay_ms makes a RECURRING job's
--              successor or a WaitingException's copy).
--   p_now      the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: one row per input object
--   id        the job.
--   finished  1 if the result was written, 0 if the caller no longer owns the job.
-- The batched form of background_job_finish for `bgq work`: one call writes every result
--   (background_job_finish_results does the work: group rows locked, jobs written, copies inserted,
--   groups woken, released jobs NOTIFY). A worker without a broker publishes nothing, so the
--   promoted jobs and copies are not returned: claims find them.
-- Locks, Fencing: those of background_job_finish_results (the group rows of the grouped jobs, in
--   serial_group order, then the job rows; each row is written only WHERE state = 2 AND
--   number_of_attempts = attempt).
-- Errors: those of background_job_finish_results (BQ002, nothing written, when a state is not 1,
--   3, 4, 5 or 7, or when a FINISHED RECURRING job would be written without a clone_delay_ms).
-- Idempotent: yes (a repeated call is fenced out: finished = 0).
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION background_job_finish_batch(
    p_results TEXT,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    id BIGINT,
    finished INTEGER
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_written TEXT := background_job_finish_results(p_results, p_now);
BEGIN
    RETURN QUERY
    SELECT r.id, CASE WHEN w.id IS NULL THEN 0 ELSE 1 END
    FROM JSON_TO_RECORDSET(p_results::JSON) AS r (id BIGINT)
    LEFT JOIN JSON_TO_RECORDSET(v_written::JSON) AS w (id BIGINT) ON w.id = r.id;
END;
$$;
