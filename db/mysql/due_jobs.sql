-- bgq {{ table }}_due_jobs, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL {{ table }}_due_jobs(p_queue, p_broker_mode, p_limit, p_now)
--   p_queue        the base queue (its sub-queues '<p_queue>_<sub>' are included).
--   p_broker_mode  0: cron mode, states 1 READY, 4 TEMPORARILY_FAILED, 6 WAITING,
--                  8 BROKER_FAILED; 1: broker mode, states -1 BACK_TO_BROKER, 8 BROKER_FAILED.
--   p_limit        at most this many rows (process() uses 1000).
--   p_now          the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: rows (id, state, queue, priority) in id order, of jobs that are due: BACK_TO_BROKER
--   always; others when processed_by_broker = 1 or when
--   GREATEST(created_at, last_attempt_at) + CEIL(postponed_by / 1000) s <= p_now.
-- Fencing: none needed: read-only; every job it names is claimed or promoted by a fenced call.
-- Locks: none (read-only); each job is then claimed one by one by {{ table }}_claim.
-- Index: {{ table }}_state (state, id). Errors: none. Idempotent: yes.
CREATE PROCEDURE {{ table }}_due_jobs(
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
    FROM {{ table }}
    WHERE
        (
            (p_broker_mode = 0 AND {{ claimable() }})
            OR (p_broker_mode <> 0 AND state IN (-1, 8))
        )
        AND {{ in_queue() }}
        AND (state = -1 OR {{ due() }})
    ORDER BY id
    LIMIT p_limit;
END
