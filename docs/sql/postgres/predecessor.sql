-- bgq background_job_predecessor, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT background_job_predecessor(p_id) -> BIGINT or NULL
--   p_id  the job whose predecessor is wanted.
--   Returns the job of the same serial group that must run before p_id: a PROCESSING job of
--   the group (any priority), else the group's first claimable job (-1, 1, 4, 6, 8) in
--   (priority, id) order when it comes before p_id. NULL when p_id has no group, does not exist
--   or is first in line.
-- Locks: none. It reads without FOR UPDATE: at READ COMMITTED each statement of a VOLATILE
--   function sees the latest committed rows, so a caller that holds the group lock sees them,
--   not an older snapshot.
-- Cost: two index dives (background_job_running_group, background_job_pending_head), independent of
--   how many jobs wait in the group.
-- Fencing: read-only. Errors: none. Idempotent: yes.
-- Note: groups span every queue of the table (a group never runs two jobs at once, whatever
--   queue they are in).
CREATE OR REPLACE FUNCTION background_job_predecessor(p_id BIGINT)
RETURNS BIGINT
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_group VARCHAR;
    v_priority INTEGER;
    v_result BIGINT;
    v_head_priority INTEGER;
BEGIN
    SELECT j.serial_group, j.priority INTO v_group, v_priority
    FROM background_job AS j WHERE j.id = p_id;
    IF v_group IS NULL THEN
        RETURN NULL;
    END IF;

    SELECT j.id INTO v_result
    FROM background_job AS j
    WHERE j.serial_group = v_group AND j.state = 2 AND j.id <> p_id;
    IF v_result IS NOT NULL THEN
        RETURN v_result;
    END IF;

    SELECT j.id, j.priority INTO v_result, v_head_priority
    FROM background_job AS j
    WHERE j.serial_group = v_group AND j.state IN (-1, 1, 4, 6, 8)
    ORDER BY j.priority, j.id
    LIMIT 1;
    IF v_result IS NULL OR v_result = p_id THEN
        RETURN NULL;
    END IF;
    IF v_head_priority < v_priority OR (v_head_priority = v_priority AND v_result < p_id) THEN
        RETURN v_result;
    END IF;
    RETURN NULL;
END;
$$;
