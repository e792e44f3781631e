-- bgq background_job_schedule_retire, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_schedule_retire(p_queue, p_names_json, p_now)
--   p_queue       the base queue: schedules of it and of its sub-queues '<p_queue>_<sub>'.
--   p_names_json  a JSON array of the schedule names the code still declares.
--   p_now         the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: one row (retired): how many schedules were deactivated.
-- What it does: a schedule of the queue that the code no longer declares becomes inactive
--   (active = 0): it fires no more, and `bgq schedules` still shows it (with its last job).
--   Declaring it again reactivates it (background_job_schedule_upsert).
-- Locks: the changed schedule rows. Fencing: none needed. Errors: none. Idempotent: yes.
-- Transaction: never commits (a function cannot).
CREATE OR REPLACE FUNCTION background_job_schedule_retire(
    p_queue VARCHAR,
    p_names_json TEXT,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    retired INTEGER
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_count INTEGER := 0;
BEGIN
    UPDATE background_job_schedule AS s
    SET active = 0, updated_at = v_now
    WHERE
        s.active = 1
        AND (s.queue = p_queue OR LEFT(s.queue, LENGTH(p_queue) + 1) = p_queue || '_')
        AND NOT EXISTS (
            SELECT 1 FROM JSON_ARRAY_ELEMENTS_TEXT(COALESCE(p_names_json, '[]')::JSON) AS n (name)
            WHERE n.name = s.name
        );
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN QUERY SELECT v_count;
END;
$$;
