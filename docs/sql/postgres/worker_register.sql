-- bgq background_job_worker_register, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_worker_register(p_host, p_pid, p_mode, p_queue, p_version, p_now)
--   p_host     the worker's host name.
--   p_pid      its process id.
--   p_mode     'work', 'consume' or 'process' (the command it runs).
--   p_queue    the queue it takes jobs from.
--   p_version  the bgq version it runs.
--   p_now      the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: exactly one row
--   id  the new worker's id: the claims store it in the jobs' worker_id, and the worker passes
--       it to background_job_worker_heartbeat and background_job_worker_deregister.
-- Inserts one background_job_worker row, started_at = last_heartbeat_at = p_now, jobs_done 0.
-- Locks: the new row only.
-- Fencing: none needed (a new row nobody else knows yet).
-- Errors: a p_mode outside the three violates the table's CHECK (the caller validates first).
-- Idempotent: no (each call registers another worker).
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT.
CREATE OR REPLACE FUNCTION background_job_worker_register(
    p_host VARCHAR,
    p_pid INTEGER,
    p_mode VARCHAR,
    p_queue VARCHAR,
    p_version VARCHAR,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    id BIGINT
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
BEGIN
    RETURN QUERY
    INSERT INTO background_job_worker AS w (
        host, pid, mode, queue, started_at, last_heartbeat_at, current_job_id, jobs_done, version
    )
    VALUES (p_host, p_pid, p_mode, p_queue, v_now, v_now, NULL, 0, p_version)
    RETURNING w.id;
END;
$$;
