-- bgq background_job_due_jobs, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_due_jobs(p_queue, p_broker_mode, p_limit, p_now)
--   p_queue        the base queue (its sub-queues '<p_queue>_<sub>' are included).
--   p_broker_mode  0: cron mode, states 1 READY, 4 TEMPORARILY_FAILED, 6 WAITING,
--                  8 BROKER_FAILED; 1: broker mode, states -1 BACK_TO_BROKER, 8 BROKER_FAILED.
--   p_limit        at most this many rows (process() uses 1000).
--   p_now          the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: rows (id, state, queue, priority) in id order, of jobs that are due: BACK_TO_BROKER
--   always; others when processed_by_broker = 1 or when
--   GREATEST(created_at, last_attempt_at) + CEIL(postponed_by / 1000) s <= p_now.
-- Fencing: none needed: read-only; every job it names is claimed or promoted by a fenced call.
-- Locks: none (read-only); each job is then claimed one by one by background_job_claim.
-- Index: background_job_state (state, id). Errors: none. Idempotent: yes.
CREATE PROCEDURE background_job_due_jobs(
    IN p_queue VARCHAR(255),
    IN p_broker_mode TINYINT,
    IN p_limit INT,
    IN p_now DATETIME(6)
)
READS SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));

    SELECT
        id,
        state,
        queue,
        priority
    FROM background_job
    WHERE
        (
            (p_broker_mode = 0 AND state IN (1, 4, 6, 8))
            OR (p_broker_mode <> 0 AND state IN (-1, 8))
        )
        AND (queue = p_queue OR LEFT(queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
        AND (state = -1 OR ((processed_by_broker = 1 OR GREATEST(created_at, COALESCE(last_attempt_at, created_at))
+ INTERVAL CEIL(COALESCE(postponed_by, 0) / 1000) SECOND <= v_now) AND NOT EXISTS (
    SELECT 1 FROM background_job_paused AS pz
    WHERE
        (
            pz.kind = 'queue'
            AND (
                queue = pz.name
                OR LEFT(queue, CHAR_LENGTH(pz.name) + 1) = CONCAT(pz.name, '_')
            )
        )
        OR (pz.kind = 'group' AND serial_group = pz.name)
)))
    ORDER BY id
    LIMIT p_limit;
END
