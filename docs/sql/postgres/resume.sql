-- bgq background_job_resume, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_resume(p_kind, p_name)
--   p_kind  'queue' or 'group'.
--   p_name  the name given to background_job_pause.
-- Result: one row (resumed): 1 when it was paused, 0 when it was not.
-- What it does: deletes the pause row; the next claims take the jobs again in (priority, id)
--   order (nothing else was changed while paused). In broker mode a message that arrived while
--   paused was sent back with a delay (outcome 'paused' of background_job_claim), so no job needs
--   re-publishing.
-- Locks: the pause row. Fencing: none needed. Errors: none. Idempotent: yes.
-- Transaction: never commits (a function cannot).
CREATE OR REPLACE FUNCTION background_job_resume(
    p_kind VARCHAR,
    p_name VARCHAR
)
RETURNS TABLE (
    resumed INTEGER
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_gone INTEGER := 0;
BEGIN
    DELETE FROM background_job_paused AS p WHERE p.kind = p_kind AND p.name = p_name;
    GET DIAGNOSTICS v_gone = ROW_COUNT;
    RETURN QUERY SELECT v_gone;
END;
$$;
