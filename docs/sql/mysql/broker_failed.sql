-- bgq background_job_broker_failed, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_broker_failed(p_id, p_error, p_now)
--   p_id     the job whose id could not be sent to the broker.
--   p_error  why (the producer's error message), stored as error_message.
--   p_now    the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: exactly one row
--   changed  1 if the job is now BROKER_FAILED; 0 if it was not waiting for its message (no such
--            job, or PROCESSING, WAITING, FINISHED, PERMANENTLY_FAILED, REDUNDANT or
--            BROKER_FAILED already): nothing changed.
-- A job still waiting for its message (-1 BACK_TO_BROKER, 1 READY, 4 TEMPORARILY_FAILED) becomes
--   8 BROKER_FAILED with error_message = p_error and updated_at = p_now; nothing else changes.
--   The next `bgq process` runs it inline (broker mode too).
-- Locks: the job row only. No group lock: 8 is claimable like the states it replaces, so the
--   group's order and its WAITING head are unchanged.
-- Fencing: WHERE state IN (-1, 1, 4): a job that a claim, a finish or a person moved on meanwhile
--   (PROCESSING, WAITING, finished) is left untouched and changed = 0.
-- Errors: none. Idempotent: yes (a second call finds BROKER_FAILED: changed = 0, the first
--   error_message stays).
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE background_job_broker_failed(
    IN p_id BIGINT UNSIGNED,
    IN p_error TEXT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_changed INT DEFAULT 0;

    UPDATE background_job
    SET state = 8, error_message = p_error, updated_at = v_now
    WHERE id = p_id AND state IN (-1, 1, 4);
    SET v_changed = ROW_COUNT();

    SELECT v_changed AS changed;
END
