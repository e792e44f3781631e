-- bgq background_job_monitor, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_monitor(p_queue, p_long_s, p_now)
--   p_queue   the base queue (its sub-queues '<p_queue>_<sub>' are included).
--   p_long_s  a PROCESSING job started (last_attempt_at) more than this many seconds before
--             p_now counts as running too long (the monitor uses 86400, 24 hours).
--   p_now     the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: rows (state, job_count, oldest_since), always exactly three, in this order:
--   4  TEMPORARILY_FAILED jobs: their count and MIN(created_at);
--   5  PERMANENTLY_FAILED jobs: their count and MIN(created_at);
--   2  PROCESSING jobs with last_attempt_at < p_now - p_long_s: their count and
--      MIN(last_attempt_at). A long run is measured from its start, not from updated_at: a hung
--      callback that keeps sending heartbeats never ages for the reaper, but it does here.
--   A state without such jobs reads job_count 0 and oldest_since NULL.
-- Locks: none (read-only, VOLATILE so that it sees the latest committed rows).
-- Fencing: none needed: read-only; a report for people.
-- Index: background_job_state (state, id). Errors: none. Idempotent: yes.
-- Transaction: never commits (a function cannot); needs none.
CREATE OR REPLACE FUNCTION background_job_monitor(
    p_queue VARCHAR,
    p_long_s INTEGER,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    state SMALLINT,
    job_count BIGINT,
    oldest_since TIMESTAMPTZ
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
BEGIN
    RETURN QUERY
    SELECT r.state, r.job_count, r.oldest_since
    FROM (
        SELECT 1 AS position, 4::SMALLINT AS state, COUNT(*) AS job_count,
            MIN(j.created_at) AS oldest_since
        FROM background_job AS j
        WHERE j.state = 4
          AND (j.queue = p_queue OR LEFT(j.queue, LENGTH(p_queue) + 1) = p_queue || '_')
        UNION ALL
        SELECT 2 AS position, 5::SMALLINT AS state, COUNT(*) AS job_count,
            MIN(j.created_at) AS oldest_since
        FROM background_job AS j
        WHERE j.state = 5
          AND (j.queue = p_queue OR LEFT(j.queue, LENGTH(p_queue) + 1) = p_queue || '_')
        UNION ALL
        SELECT 3 AS position, 2::SMALLINT AS state, COUNT(*) AS job_count,
            MIN(j.last_attempt_at) AS oldest_since
        FROM background_job AS j
        WHERE j.state = 2
          AND j.last_attempt_at < v_now - p_long_s * INTERVAL '1 second'
          AND (j.queue = p_queue OR LEFT(j.queue, LENGTH(p_queue) + 1) = p_queue || '_')
    ) AS r
    ORDER BY r.position;
END;
$$;
