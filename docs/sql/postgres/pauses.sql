-- bgq background_job_pauses, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_pauses()
-- Result: rows (kind, name, reason, paused_by, paused_at) of every paused queue and group,
--   ordered by kind, name (`bgq monitor` and `bgq pause` without arguments show them).
-- Locks: none (read-only). Fencing: none needed. Errors: none. Idempotent: yes.
CREATE OR REPLACE FUNCTION background_job_pauses()
RETURNS TABLE (
    kind VARCHAR,
    name VARCHAR,
    reason TEXT,
    paused_by VARCHAR,
    paused_at TIMESTAMPTZ
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT p.kind, p.name, p.reason, p.paused_by, p.paused_at
    FROM background_job_paused AS p
    ORDER BY p.kind, p.name;
END;
$$;
