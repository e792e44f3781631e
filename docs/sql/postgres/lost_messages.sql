-- bgq background_job_lost_messages, version 2 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_lost_messages(p_queue, p_timeout_s, p_limit, p_now)
--   p_queue      the base queue (its sub-queues '<p_queue>_<sub>' are included).
--   p_timeout_s  a READY or TEMPORARILY_FAILED job untouched for longer than this many seconds
--                (updated_at < p_now - p_timeout_s) has lost its broker message.
--   p_limit      at most this many jobs per call (process() uses 1000).
--   p_now        the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: rows (id, queue, priority, state) of the jobs marked for republishing, in id order;
--   state is the job's state, unchanged (1 or 4). The caller re-publishes each one at once
--   (no TTL) and logs a warning.
-- The lost-message pass (broker mode's `bgq process`): a job in 1 READY or 4 TEMPORARILY_FAILED
--   that is lost (see p_timeout_s) and whose availability has passed,
--   GREATEST(created_at, last_attempt_at) + CEIL(postponed_by / 1000) s <= p_now (the rule of
--   background_job_due_jobs, without its processed_by_broker exception: a job in its backoff is
--   still in the broker's delay queue; and neither its queue nor its group is paused: a
--   paused job's message circles through the delay queue already, background_job_pause), gets
--   postponed_by = NULL and updated_at = p_now. The state is not changed. Clearing
--   postponed_by moves no availability into the future, and the new updated_at keeps the job
--   out of the next passes for another p_timeout_s. A false alarm is harmless: the duplicate
--   message loses at the conditional claim.
-- Locks: each changed job row only. No group lock: the state does not change, so neither does
--   the group's order or its WAITING head.
-- Fencing: each UPDATE is conditional on state = the state read AND updated_at = the value
--   read, so a claim, a heartbeat or another pass that got there first wins.
-- Errors: none. Idempotent: yes (a second call right after finds the new updated_at: no rows).
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION background_job_lost_messages(
    p_queue VARCHAR,
    p_timeout_s INTEGER,
    p_limit INTEGER,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    id BIGINT,
    queue VARCHAR,
    priority INTEGER,
    state SMALLINT
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_lost RECORD;
    v_ids BIGINT[] := '{}';
BEGIN
    FOR v_lost IN
        SELECT j.id, j.state, j.updated_at
        FROM background_job AS j
        WHERE j.state IN (1, 4)
          AND j.updated_at < v_now - p_timeout_s * INTERVAL '1 second'
          AND (j.queue = p_queue OR LEFT(j.queue, LENGTH(p_queue) + 1) = p_queue || '_')
          AND GREATEST(j.created_at, COALESCE(j.last_attempt_at, j.created_at))
+ CEIL(COALESCE(j.postponed_by, 0) / 1000.0) * INTERVAL '1 second' <= v_now
          AND NOT EXISTS (
    SELECT 1 FROM background_job_paused AS pz
    WHERE
        (
            pz.kind = 'queue'
            AND (j.queue = pz.name OR LEFT(j.queue, LENGTH(pz.name) + 1) = pz.name || '_')
        )
        OR (pz.kind = 'group' AND j.serial_group = pz.name)
)
        ORDER BY j.id
        LIMIT p_limit
    LOOP
        UPDATE background_job AS j
        SET postponed_by = NULL, updated_at = v_now
        WHERE j.id = v_lost.id AND j.state = v_lost.state AND j.updated_at = v_lost.updated_at;
        IF FOUND THEN
            v_ids := v_ids || v_lost.id;
        END IF;
    END LOOP;

    RETURN QUERY
    SELECT j.id, j.queue, j.priority, j.state
    FROM background_job AS j
    WHERE j.id = ANY(v_ids)
    ORDER BY j.id;
END;
$$;
