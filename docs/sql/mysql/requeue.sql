-- bgq background_job_requeue, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_requeue(p_id, p_reason, p_now)
--   p_id      the job to run again.
--   p_reason  why (recorded as error_message 'Requeued: <reason>').
--   p_now     the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: one row (id, queue, priority, previous_state); the job is READY, due at once
--   (postponed_by and finished_at cleared, last_attempt_at kept, number_of_attempts kept so
--   the next claim's token is new). In broker mode the caller publishes the id.
-- The DBA's manual requeue: a PERMANENTLY_FAILED, REDUNDANT or FINISHED job (or one waiting for
--   its backoff) goes back to work. A grouped job takes its (priority, id) place in its group
--   again; the claim decides when it runs.
-- Locks: the group row (for a grouped job), then the job row.
-- Fencing: refuses a PROCESSING job (its worker still owns it; the reaper handles dead ones).
-- Errors: 31001 / SQLSTATE BQ001 no such job; 31003 / SQLSTATE BQ003 the job is PROCESSING.
-- Idempotent: yes (a READY job stays READY; only the message and updated_at change).
-- Transaction: never commits. From a console:
--   START TRANSACTION; CALL background_job_requeue(42, 'fixed the SMTP password', NULL); COMMIT;
CREATE PROCEDURE background_job_requeue(
    IN p_id BIGINT UNSIGNED,
    IN p_reason TEXT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_found INT DEFAULT 1;
    DECLARE v_group VARCHAR(255) DEFAULT NULL;
    DECLARE v_state SMALLINT DEFAULT NULL;
    DECLARE v_promoted BIGINT UNSIGNED DEFAULT NULL;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;

    SELECT serial_group INTO v_group
    FROM background_job
    WHERE id = p_id;
    IF v_found = 0 THEN
        SIGNAL SQLSTATE 'BQ001' SET MYSQL_ERRNO = 31001, MESSAGE_TEXT = 'bgq: no such job';
    END IF;
    IF v_group IS NOT NULL THEN
        INSERT INTO background_job_group (serial_group, updated_at) VALUES (v_group, v_now)
        ON DUPLICATE KEY UPDATE updated_at = v_now;
    END IF;
    SELECT state INTO v_state
    FROM background_job
    WHERE id = p_id
    FOR UPDATE;
    IF v_state = 2 THEN
        SIGNAL SQLSTATE 'BQ003'
            SET MYSQL_ERRNO = 31003, MESSAGE_TEXT = 'bgq: the job is PROCESSING; its worker owns it';
    END IF;

    UPDATE background_job
    SET
        state = 1,
        error_message = CONCAT('Requeued: ', COALESCE(p_reason, '')),
        postponed_by = NULL,
        finished_at = NULL,
        updated_at = v_now
    WHERE id = p_id AND state <> 2;
    IF v_group IS NOT NULL THEN
        CALL background_job_group_wake(v_group, v_now, v_promoted);
    END IF;

    SELECT
        id,
        queue,
        priority,
        v_state AS previous_state
    FROM background_job
    WHERE id = p_id;
END
