-- bgq background_job_clear_finished, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_clear_finished(p_queue, p_before, p_now)
--   p_queue   the base queue (its sub-queues '<p_queue>_<sub>' are included).
--   p_before  delete only jobs with created_at <= p_before; NULL: every finished job created up
--             to p_now (`bgq clear-finished N` passes today 00:00 UTC minus N days).
--   p_now     the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: exactly one row
--   deleted  the number of job rows deleted.
-- Deletes the queue's FINISHED (3) jobs, and only those: REDUNDANT, PERMANENTLY_FAILED and every
--   other state stay. Then deletes the rows of background_job_group (any queue: a group row has
--   none) whose group has no unfinished job any more (none PROCESSING, none claimable: -1, 1,
--   4, 6, 8). A claim or a finish upserts its group row, so a deleted row is recreated whenever
--   the group is used again.
-- Locks: the deleted job rows; then each candidate group row, FOR UPDATE SKIP LOCKED: a group
--   row another transaction holds (a claim, a finish) is in use and is skipped, so this never
--   waits for a group and never deadlocks with a claim (which locks the group row first).
-- Fencing: a group row is deleted only after it is locked, by a statement that re-checks that
--   its group has no PROCESSING or claimable job: every procedure that makes a grouped job
--   WAITING or PROCESSING holds the group row, so that check cannot miss one. A job published
--   into the group later recreates the row at its claim.
-- Index: background_job_state (state, id); background_job_running_group and background_job_pending_head
--   for the group check. Errors: none. Idempotent: yes (a second call deletes 0).
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION background_job_clear_finished(
    p_queue VARCHAR,
    p_before TIMESTAMPTZ,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    deleted INTEGER
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_deleted INTEGER := 0;
    v_group VARCHAR;
BEGIN
    DELETE FROM background_job AS j
    WHERE j.state = 3
      AND j.created_at <= COALESCE(p_before, v_now)
      AND (j.queue = p_queue OR LEFT(j.queue, LENGTH(p_queue) + 1) = p_queue || '_');
    GET DIAGNOSTICS v_deleted = ROW_COUNT;

    -- The candidate group rows, each locked as it is fetched (a row in use is skipped) and then
    -- checked again by the DELETE, whose snapshot is taken after the lock.
    FOR v_group IN
        SELECT g.serial_group
        FROM background_job_group AS g
        WHERE (SELECT 1 FROM background_job AS r WHERE r.serial_group = g.serial_group AND r.state = 2 LIMIT 1) IS NULL
          AND NOT EXISTS (
                SELECT 1 FROM background_job AS p
                WHERE p.serial_group = g.serial_group AND p.state IN (-1, 1, 4, 6, 8)
            )
        ORDER BY g.serial_group
        FOR UPDATE OF g SKIP LOCKED
    LOOP
        DELETE FROM background_job_group AS g
        WHERE g.serial_group = v_group
          AND (SELECT 1 FROM background_job AS r WHERE r.serial_group = v_group AND r.state = 2 LIMIT 1) IS NULL
          AND NOT EXISTS (
                SELECT 1 FROM background_job AS p
                WHERE p.serial_group = v_group AND p.state IN (-1, 1, 4, 6, 8)
            );
    END LOOP;

    RETURN QUERY SELECT v_deleted;
END;
$$;
