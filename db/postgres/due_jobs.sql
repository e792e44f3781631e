-- bgq {{ table }}_due_jobs, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM {{ table }}_due_jobs(p_queue, p_broker_mode, p_limit, p_now)
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
--   then claimed one by one by {{ table }}_claim.
-- Index: {{ table }}_state (state, id). Errors: none. Idempotent: yes.
CREATE OR REPLACE FUNCTION {{ table }}_due_jobs(
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
    FROM {{ table }} AS j
    WHERE
        (
            (p_broker_mode = 0 AND {{ claimable('j') }})
            OR (p_broker_mode <> 0 AND j.state IN (-1, 8))
        )
        AND {{ in_queue('j') }}
        AND (j.state = -1 OR {{ due('j') }})
    ORDER BY j.id
    LIMIT p_limit;
END;
$$;
