-- bgq {{ table }}_pauses, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM {{ table }}_pauses()
-- Result: rows (kind, name, reason, paused_by, paused_at) of every paused queue and group,
--   ordered by kind, name (`bgq monitor` and `bgq pause` without arguments show them).
-- Locks: none (read-only). Fencing: none needed. Errors: none. Idempotent: yes.
CREATE OR REPLACE FUNCTION {{ table }}_pauses()
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
    FROM {{ table }}_paused AS p
    ORDER BY p.kind, p.name;
END;
$$;
