-- bgq background_job_back_to_broker, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_back_to_broker(p_queue, p_limit, p_now)
--   p_queue  the base queue (its sub-queues '<p_queue>_<sub>' are included).
--   p_limit  at most this many jobs per call (process() uses 1000).
--   p_now    the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
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
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE background_job_back_to_broker(
    IN p_queue VARCHAR(255),
    IN p_limit INT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_id BIGINT UNSIGNED;
    DECLARE v_ids JSON DEFAULT JSON_ARRAY();
    DECLARE c_back CURSOR FOR
        SELECT id
        FROM background_job
        WHERE
            state = -1
            AND (queue = p_queue OR LEFT(queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
        ORDER BY id
        LIMIT p_limit;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;

    OPEN c_back;
    back_loop: LOOP
        FETCH c_back INTO v_id;
        IF v_done = 1 THEN
            LEAVE back_loop;
        END IF;
        UPDATE background_job
        SET state = 1, postponed_by = NULL, updated_at = v_now
        WHERE id = v_id AND state = -1;
        IF ROW_COUNT() > 0 THEN
            SET v_ids = JSON_ARRAY_APPEND(v_ids, '$', v_id);
        END IF;
    END LOOP;
    CLOSE c_back;

    SELECT
        j.id,
        j.queue,
        j.priority
    FROM JSON_TABLE(v_ids, '$[*]' COLUMNS (back_id BIGINT UNSIGNED PATH '$')) AS b
    INNER JOIN background_job AS j ON j.id = b.back_id
    ORDER BY j.id;
END
