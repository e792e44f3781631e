-- bgq background_job_pause, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_pause(p_kind, p_name, p_reason, p_by, p_now)
--   p_kind    'queue' or 'group'.
--   p_name    the queue (its sub-queues '<p_name>_<sub>' are paused with it) or the serial group.
--   p_reason  why (stored; shown by `bgq monitor`).
--   p_by      who paused it (stored; `bgq pause` passes user@host).
--   p_now     the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: one row (paused): 1 when this call paused it, 0 when it was paused already (the
--   reason and paused_by are replaced, paused_at kept).
-- What it does: a row in background_job_paused. Every claim (claim_batch, due_jobs, claim_job, by
--   the not_paused rule of macros/rules.sql) then skips the queue's or the group's jobs; a
--   running job is not interrupted, and a claim already past its check may still start one job.
-- Locks: the pause row. Fencing: none needed (no job row is written).
-- Errors: SQLSTATE BQ002 when p_kind is not 'queue' or 'group' or p_name is empty (nothing
--   written). Idempotent: yes.
-- Transaction: never commits (a function cannot). From a console:
--   BEGIN; SELECT * FROM background_job_pause('group', 'customer-42', 'migrating', 'dba', NULL); COMMIT;
CREATE OR REPLACE FUNCTION background_job_pause(
    p_kind VARCHAR,
    p_name VARCHAR,
    p_reason TEXT,
    p_by VARCHAR,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    paused INTEGER
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_new INTEGER := 0;
BEGIN
    IF p_kind IS NULL OR p_kind NOT IN ('queue', 'group') OR COALESCE(p_name, '') = '' THEN
        RAISE EXCEPTION 'bgq: pause kind must be queue or group, with a name' USING ERRCODE = 'BQ002';
    END IF;
    INSERT INTO background_job_paused AS p (kind, name, reason, paused_by, paused_at)
    VALUES (p_kind, p_name, p_reason, p_by, v_now)
    ON CONFLICT (kind, name) DO NOTHING;
    GET DIAGNOSTICS v_new = ROW_COUNT;
    IF v_new = 0 THEN
        UPDATE background_job_paused AS p
        SET reason = p_reason, paused_by = p_by
        WHERE p.kind = p_kind AND p.name = p_name;
    END IF;
    RETURN QUERY SELECT v_new;
END;
$$;
