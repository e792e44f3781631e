-- bgq background_job_back_to_broker, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_back_to_broker(p_queue, p_limit, p_now)
--   p_queue  the base queue (its sub-queues '<p_queue>_<sub>' are included).
--   p_limit  at most this many jobs per call (process() uses 1000).
--   p_now    the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: rows (id, queue, priority) of the jobs moved BACK_TO_BROKER -> READY, in id order.
--   The caller publishes them (broker mode's `bgq process`).
-- Each BACK_TO_BROKER (-1) job of the queue, in id order, becomes READY (1) with
--   postponed_by = NULL (due at once) and updated_at = p_now; nothing else changes.
-- Locks: each changed job row only. No group lock: -1 and 1 are both claimable, so the group's
--   order and its WAITING head are unchanged.
-- Fencing: each UPDATE is conditional on state = -1, so a job claimed (or set otherwise by a
--   person) between the read and the write is left untouched and not returned.
-- Index: background_job_state (state, id). Errors: none.
-- Idempotent: yes (a second call finds no BACK_TO_BROKER job and returns no rows).
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION background_job_back_to_broker(
    p_queue VARCHAR,
    p_limit INTEGER,
    p_now TIMESTAMPTZ DEFAULT NULL
)
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
    v_id BIGINT;
    v_ids BIGINT[] := '{}';
BEGIN
    FOR v_id IN
        SELECT j.id
        FROM background_job AS j
        WHERE j.state = -1
          AND (j.queue = p_queue OR LEFT(j.queue, LENGTH(p_queue) + 1) = p_queue || '_')
        ORDER BY j.id
        LIMIT p_limit
    LOOP
        UPDATE background_job AS j
        SET state = 1, postponed_by = NULL, updated_at = v_now
        WHERE j.id = v_id AND j.state = -1;
        IF FOUND THEN
            v_ids := v_ids || v_id;
        END IF;
    END LOOP;

    RETURN QUERY
    SELECT j.id, j.queue, j.priority
    FROM background_job AS j
    WHERE j.id = ANY(v_ids)
    ORDER BY j.id;
END;
$$;
