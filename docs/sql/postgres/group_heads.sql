-- bgq background_job_group_heads, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_group_heads()
-- Result: rows (serial_group, id, priority), one per serial group that has WAITING jobs: its
--   WAITING job with the lowest priority number, then the lowest id (a gap in the priorities is
--   fine), ordered by id.
-- How: read from background_job_group, whose waiting head background_job_group_wake re-derives in the
--   same transaction as every state change of a grouped job. So the cost grows with the number
--   of groups, never with the number of waiting jobs (no scan of background_job).
-- Fencing: none needed: read-only; every job it names is claimed or promoted by a fenced call.
-- Locks: none (read-only, VOLATILE so that it sees the latest committed rows). Errors: none.
--   Idempotent: yes.
CREATE OR REPLACE FUNCTION background_job_group_heads()
RETURNS TABLE (
    serial_group VARCHAR,
    id BIGINT,
    priority INTEGER
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT g.serial_group, g.waiting_head_id, g.waiting_head_priority
    FROM background_job_group AS g
    WHERE g.waiting_head_id IS NOT NULL
    ORDER BY g.waiting_head_id;
END;
$$;
