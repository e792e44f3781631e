-- bgq background_job_fire, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_fire(p_name, p_fire_at, p_next_at, p_now)
--   p_name     the schedule.
--   p_fire_at  the fire time to publish (a time the cron names, at or before p_now), or NULL to
--              publish nothing (fires skipped by the 'skip' policy) and only move next_fire_at.
--   p_next_at  the schedule's next fire time after this one.
--   p_now      the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: one row (job_id, queue, priority, fired): fired 1 and the new READY job when this call
--   published p_fire_at; 0 and NULLs when another worker had published it already, the schedule
--   is inactive or unknown, or p_fire_at is NULL.
-- Exactly once: the INSERT into background_job_fired, whose primary key is (schedule_name,
--   fire_at), is the deduplication; however many workers on however many hosts race for one
--   fire time, one INSERT succeeds (a duplicate key, error 1062, is caught) and only that call
--   inserts the job, in the same transaction. next_fire_at only ever moves forward (GREATEST),
--   so a worker with an old read cannot move it back. Rows of background_job_fired older than a
--   day before p_fire_at are deleted as it goes.
-- Locks: the schedule row (FOR UPDATE: racing workers take turns), the new fired row and job.
-- Fencing: the primary key (above); an inactive schedule fires nothing.
-- Errors: none. Idempotent: yes (a repeated call is 'fired 0').
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT; the job and its
--   fired row commit together.
CREATE PROCEDURE background_job_fire(
    IN p_name VARCHAR(255),
    IN p_fire_at DATETIME(6),
    IN p_next_at DATETIME(6),
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_found INT DEFAULT 0;
    DECLARE v_new INT DEFAULT 0;
    DECLARE v_job BIGINT UNSIGNED DEFAULT NULL;
    DECLARE v_queue VARCHAR(255) DEFAULT NULL;
    DECLARE v_priority INT DEFAULT NULL;

    SELECT
        COUNT(*) AS found,
        MAX(queue) AS queue,
        MAX(priority) AS priority
    INTO v_found, v_queue, v_priority
    FROM background_job_schedule
    WHERE name = p_name AND active = 1
    FOR UPDATE;
    IF v_found > 0 AND p_fire_at IS NOT NULL THEN
        BEGIN
            DECLARE CONTINUE HANDLER FOR 1062 SET v_new = -1;
            SET v_new = 1;
            INSERT INTO background_job_fired (schedule_name, fire_at, fired_at)
            VALUES (p_name, p_fire_at, v_now);
        END;
    END IF;
    IF v_new = 1 THEN
        INSERT INTO background_job (
            queue, priority, callback_name, parameters_json, state, number_of_attempts,
            serial_group, mode, processed_by_broker, created_at, updated_at
        )
        SELECT
            queue,
            priority,
            callback_name,
            parameters_json,
            1 AS state,
            0 AS number_of_attempts,
            serial_group,
            'normal' AS mode,
            0 AS processed_by_broker,
            v_now AS created_at,
            v_now AS updated_at
        FROM background_job_schedule
        WHERE name = p_name;
        SET v_job = LAST_INSERT_ID();
        UPDATE background_job_fired SET job_id = v_job
        WHERE schedule_name = p_name AND fire_at = p_fire_at;
        DELETE FROM background_job_fired
        WHERE schedule_name = p_name AND fire_at < p_fire_at - INTERVAL 1 DAY;
    END IF;
    IF v_found > 0 THEN
        UPDATE background_job_schedule
        SET
            next_fire_at = GREATEST(COALESCE(next_fire_at, p_next_at), p_next_at),
            last_fire_at = CASE WHEN v_new = 1 THEN p_fire_at ELSE last_fire_at END,
            last_job_id = CASE WHEN v_new = 1 THEN v_job ELSE last_job_id END,
            updated_at = v_now
        WHERE name = p_name;
    END IF;

    SELECT
        v_job AS job_id,
        CASE WHEN v_new = 1 THEN v_queue END AS queue,
        CASE WHEN v_new = 1 THEN v_priority END AS priority,
        CASE WHEN v_new = 1 THEN 1 ELSE 0 END AS fired;
END
