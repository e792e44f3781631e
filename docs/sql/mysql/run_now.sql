-- bgq background_job_run_now, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_run_now(p_id, p_reason, p_now)
--   p_id      the job to run without waiting for its postponement.
--   p_reason  who and why (appended to error_message as a line 'Run now: <reason>', so the
--             error of a job in backoff stays readable above it).
--   p_now     the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: one row (id, queue, priority, previous_state); the job keeps its state (READY or
--   TEMPORARILY_FAILED) and is due at once: postponed_by is cleared, updated_at = p_now. In
--   broker mode the caller publishes the id (the claim is exactly-once, so the message that was
--   already waiting in its delay queue is harmless).
-- The console's "run now": a job that has not started (READY with a publish postponement, or
--   TEMPORARILY_FAILED in its backoff) skips the rest of its wait. A grouped job keeps its
--   (priority, id) place in its group; the claim still decides when it runs.
-- Locks: the job row only.
-- Fencing: refuses any other state (PROCESSING belongs to its worker; WAITING waits for its
--   group, not for a postponement; finished jobs need a requeue).
-- Errors: 31001 / SQLSTATE BQ001 no such job; 31003 / SQLSTATE BQ003 the job is not READY or
--   TEMPORARILY_FAILED.
-- Idempotent: yes (a job that is due stays due; only the message and updated_at change).
-- Transaction: never commits. From a console:
--   START TRANSACTION; CALL background_job_run_now(42, 'alice: the SMTP server is back', NULL); COMMIT;
CREATE PROCEDURE background_job_run_now(
    IN p_id BIGINT UNSIGNED,
    IN p_reason TEXT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_found INT DEFAULT 1;
    DECLARE v_state SMALLINT DEFAULT NULL;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;

    SELECT state INTO v_state
    FROM background_job
    WHERE id = p_id
    FOR UPDATE;
    IF v_found = 0 THEN
        SIGNAL SQLSTATE 'BQ001' SET MYSQL_ERRNO = 31001, MESSAGE_TEXT = 'bgq: no such job';
    END IF;
    IF v_state NOT IN (1, 4) THEN
        SIGNAL SQLSTATE 'BQ003'
            SET MYSQL_ERRNO = 31003,
            MESSAGE_TEXT = 'bgq: only a READY or TEMPORARILY_FAILED job can run now';
    END IF;

    UPDATE background_job
    SET
        postponed_by = NULL,
        error_message = CASE
            WHEN error_message IS NULL THEN CONCAT('Run now: ', COALESCE(p_reason, ''))
            ELSE CONCAT(error_message, '\n', 'Run now: ', COALESCE(p_reason, ''))
        END,
        updated_at = v_now
    WHERE id = p_id;

    SELECT
        id,
        queue,
        priority,
        v_state AS previous_state
    FROM background_job
    WHERE id = p_id;
END
