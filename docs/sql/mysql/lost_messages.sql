-- bgq background_job_lost_messages, version 2 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_lost_messages(p_queue, p_timeout_s, p_limit, p_now)
--   p_queue      the base queue (its sub-queues '<p_queue>_<sub>' are included).
--   p_timeout_s  a READY or TEMPORARILY_FAILED job untouched for longer than this many seconds
--                (updated_at < p_now - p_timeout_s) has lost its broker message.
--   p_limit      at most this many jobs per call (process() uses 1000).
--   p_now        the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
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
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE background_job_lost_messages(
    IN p_queue VARCHAR(255),
    IN p_timeout_s INT,
    IN p_limit INT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_id BIGINT UNSIGNED;
    DECLARE v_state SMALLINT;
    DECLARE v_updated DATETIME(6);
    DECLARE v_ids JSON DEFAULT JSON_ARRAY();
    DECLARE c_lost CURSOR FOR
        SELECT
            id,
            state,
            updated_at
        FROM background_job
        WHERE
            state IN (1, 4)
            AND updated_at < v_now - INTERVAL p_timeout_s SECOND
            AND (queue = p_queue OR LEFT(queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
            AND GREATEST(created_at, COALESCE(last_attempt_at, created_at))
+ INTERVAL CEIL(COALESCE(postponed_by, 0) / 1000) SECOND <= v_now
            AND NOT EXISTS (
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
)
        ORDER BY id
        LIMIT p_limit;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;

    OPEN c_lost;
    lost_loop: LOOP
        FETCH c_lost INTO v_id, v_state, v_updated;
        IF v_done = 1 THEN
            LEAVE lost_loop;
        END IF;
        UPDATE background_job
        SET postponed_by = NULL, updated_at = v_now
        WHERE id = v_id AND state = v_state AND updated_at = v_updated;
        IF ROW_COUNT() > 0 THEN
            SET v_ids = JSON_ARRAY_APPEND(v_ids, '$', v_id);
        END IF;
    END LOOP;
    CLOSE c_lost;

    SELECT
        j.id,
        j.queue,
        j.priority,
        j.state
    FROM JSON_TABLE(v_ids, '$[*]' COLUMNS (lost_id BIGINT UNSIGNED PATH '$')) AS l
    INNER JOIN background_job AS j ON j.id = l.lost_id
    ORDER BY j.id;
END
