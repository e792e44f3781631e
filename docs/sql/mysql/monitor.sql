-- bgq background_job_monitor, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_monitor(p_queue, p_long_s, p_now)
--   p_queue   the base queue (its sub-queues '<p_queue>_<sub>' are included).
--   p_long_s  a PROCESSING job started (last_attempt_at) more than this many seconds before
--             p_now counts as running too long (the monitor uses 86400, 24 hours).
--   p_now     the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: rows (state, job_count, oldest_since), always exactly three, in this order:
--   4  TEMPORARILY_FAILED jobs: their count and MIN(created_at);
--   5  PERMANENTLY_FAILED jobs: their count and MIN(created_at);
--   2  PROCESSING jobs with last_attempt_at < p_now - p_long_s: their count and
--      MIN(last_attempt_at). A long run is measured from its start, not from updated_at: a hung
--      callback that keeps sending heartbeats never ages for the reaper, but it does here.
--   A state without such jobs reads job_count 0 and oldest_since NULL.
-- Locks: none (read-only, consistent reads).
-- Fencing: none needed: read-only; a report for people.
-- Index: background_job_state (state, id). Errors: none. Idempotent: yes.
-- Transaction: never commits; needs none.
CREATE PROCEDURE background_job_monitor(
    IN p_queue VARCHAR(255),
    IN p_long_s INT,
    IN p_now DATETIME(6)
)
READS SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));

    SELECT
        r.state,
        r.job_count,
        r.oldest_since
    FROM (
        SELECT
            1 AS position,
            4 AS state,
            COUNT(*) AS job_count,
            MIN(created_at) AS oldest_since
        FROM background_job
        WHERE
            state = 4
            AND (queue = p_queue OR LEFT(queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
        UNION ALL
        SELECT
            2 AS position,
            5 AS state,
            COUNT(*) AS job_count,
            MIN(created_at) AS oldest_since
        FROM background_job
        WHERE
            state = 5
            AND (queue = p_queue OR LEFT(queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
        UNION ALL
        SELECT
            3 AS position,
            2 AS state,
            COUNT(*) AS job_count,
            MIN(last_attempt_at) AS oldest_since
        FROM background_job
        WHERE
            state = 2
            AND last_attempt_at < v_now - INTERVAL p_long_s SECOND
            AND (queue = p_queue OR LEFT(queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
    ) AS r
    ORDER BY r.position;
END
