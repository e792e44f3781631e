-- bgq background_job_due_jobs, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_due_jobs(p_queue, p_broker_mode, p_limit, p_now)
--   p_queue        the base queue (its sub-queues '<p_queue>_<sub>' are included).
--   p_broker_mode  0: cron mode, states 1 READY, 4 TEMPORARILY_FAILED, 6 WAITING,
--                  8 BROKER_FAILED; 1: broker mode, states -1 BACK_TO_BROKER, 8 BROKER_FAILED.
--   p_limit        at most this many rows (process() uses 1000).
--   p_now          the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: rows (id, state, queue, priority) in id order, of jobs that are due: BACK_TO_BROKER
--   always; others when processed_by_broker = 1 or when
--   GREATEST(created_at, last_attempt_at) + CEIL(postponed_by / 1000) s <= p_now.
-- Fencing: none needed: read-only; every job it names is claimed or promoted by a fenced call.
-- Locks: none (read-only, VOLATILE so that it sees the latest committed rows); each job is
--   then claimed one by one by background_job_claim.
-- Index: background_job_state (state, id). Errors: none. Idempotent: yes.
CREATE OR REPLACE FUNCTION background_job_due_jobs(
    p_queue VARCHAR,
    p_broker_mode INTEGER,
    p_limit INTEGER,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    id BIGINT,
    state SMALLINT,
    queue VARCHAR,
    priority INTEGER
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
BEGIN
    RETURN QUERY
    SELECT j.id, j.state, j.queue, j.priority
    FROM background_job AS j
    WHERE
        (
            (p_broker_mode = 0 AND j.state IN (1, 4, 6, 8))
            OR (p_broker_mode <> 0 AND j.state IN (-1, 8))
        )
        AND (j.queue = p_queue OR LEFT(j.queue, LENGTH(p_queue) + 1) = p_queue || '_')
        AND (j.state = -1 OR ((j.processed_by_broker = 1 OR GREATEST(j.created_at, COALESCE(j.last_attempt_at, j.created_at))
+ CEIL(COALESCE(j.postponed_by, 0) / 1000.0) * INTERVAL '1 second' <= v_now) AND NOT EXISTS (
    SELECT 1 FROM background_job_paused AS pz
    WHERE
        (
            pz.kind = 'queue'
            AND (j.queue = pz.name OR LEFT(j.queue, LENGTH(pz.name) + 1) = pz.name || '_')
        )
        OR (pz.kind = 'group' AND j.serial_group = pz.name)
)))
    ORDER BY j.id
    LIMIT p_limit;
END;
$$;
