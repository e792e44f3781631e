-- bgq background_job_worker_deregister, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_worker_deregister(p_id)
--   p_id  the worker (background_job_worker_register's id), at its clean exit.
-- Result: exactly one row
--   removed  1 if the row was there and is deleted; 0 if it was not (already reaped as dead).
-- Jobs are not touched: a clean exit has written or given back its jobs already.
-- Locks: the worker's row only, until the caller commits.
-- Fencing: none needed (only the worker itself calls it with its id).
-- Errors: none. Idempotent: yes.
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT.
CREATE OR REPLACE FUNCTION background_job_worker_deregister(
    p_id BIGINT
)
RETURNS TABLE (
    removed INTEGER
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_removed INTEGER := 0;
BEGIN
    DELETE FROM background_job_worker AS w WHERE w.id = p_id;
    GET DIAGNOSTICS v_removed = ROW_COUNT;

    RETURN QUERY SELECT v_removed;
END;
$$;
