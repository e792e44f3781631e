-- bgq background_job_worker_heartbeat, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_worker_heartbeat(p_id, p_current_job_id, p_jobs_done, p_now)
--   p_id              the worker (background_job_worker_register's id).
--   p_current_job_id  the job it runs now (NULL: none).
--   p_jobs_done       how many jobs it has run since its start.
--   p_now             the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: exactly one row
--   alive  1 if the worker's row exists (last_heartbeat_at is now p_now); 0 if it does not
--          (deregistered, or removed by background_job_worker_reap as dead): nothing changed, and
--          the worker should register again.
-- Locks: the worker's row only, until the caller commits (a short transaction of its own).
-- Fencing: a worker found dead and removed is never brought back by a late heartbeat: the
--   UPDATE matches no row. Its jobs were reaped (fenced there on their claim).
-- Errors: none. Idempotent: yes.
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT.
CREATE OR REPLACE FUNCTION background_job_worker_heartbeat(
    p_id BIGINT,
    p_current_job_id BIGINT,
    p_jobs_done BIGINT,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    alive INTEGER
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_alive INTEGER := 0;
BEGIN
    UPDATE background_job_worker AS w
    SET last_heartbeat_at = v_now, current_job_id = p_current_job_id, jobs_done = p_jobs_done
    WHERE w.id = p_id;
    GET DIAGNOSTICS v_alive = ROW_COUNT;

    RETURN QUERY SELECT v_alive;
END;
$$;
