-- bgq background_job_promote_waiting, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_promote_waiting(p_now)
--   p_now  the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: rows (id, queue, priority) of the jobs moved WAITING -> READY, in id order.
-- The safety net (`bgq process`): for every group that has WAITING jobs and no PROCESSING job,
--   background_job_group_wake promotes the group's head if that head is WAITING. At most one job
--   per group per call. Normally the finishing predecessor has already done this; this call
--   catches what a crash between steps left behind.
-- Locks: each candidate group row (FOR UPDATE OF the group row SKIP LOCKED: a group a worker is
--   claiming or finishing right now is left to that worker), then the promoted job rows.
-- Fencing: promotion is conditional on state = 6. Errors: none. Idempotent: yes.
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION background_job_promote_waiting(p_now TIMESTAMPTZ DEFAULT NULL)
RETURNS TABLE (
    id BIGINT,
    queue VARCHAR,
    priority INTEGER
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_group VARCHAR;
    v_promoted BIGINT;
    v_ids BIGINT[] := '{}';
BEGIN
    FOR v_group IN
        SELECT g.serial_group
        FROM background_job_group AS g
        WHERE g.waiting_head_id IS NOT NULL
          AND (SELECT 1 FROM background_job AS r WHERE r.serial_group = g.serial_group AND r.state = 2 LIMIT 1) IS NULL
        ORDER BY g.waiting_head_id
        FOR UPDATE OF g SKIP LOCKED
    LOOP
        v_promoted := background_job_group_wake(v_group, v_now);
        IF v_promoted IS NOT NULL THEN
            v_ids := v_ids || v_promoted;
        END IF;
    END LOOP;

    RETURN QUERY
    SELECT j.id, j.queue, j.priority
    FROM background_job AS j
    WHERE j.id = ANY(v_ids)
    ORDER BY j.id;
END;
$$;
