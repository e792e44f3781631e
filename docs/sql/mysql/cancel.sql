-- bgq background_job_cancel, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_cancel(p_id, p_reason, p_now)
--   p_id      the job to cancel.
--   p_reason  why (stored as error_message 'Cancelled: <reason>').
--   p_now     the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: one row (outcome, state, promoted_id, queue, priority):
--   outcome  'cancelled'        the job had not started (-1, 1, 4, 6, 8): it is REDUNDANT now
--                               (finished_at = p_now) and its group moves on;
--            'abort_requested'  the job is PROCESSING: abort_requested_at = p_now. Its worker's
--                               next heartbeat (background_job_heartbeat) reports the abort, the
--                               callback gets bgq.JobAborted, and the worker writes REDUNDANT
--                               with this message (fenced on its claim as every result);
--            'finished'         FINISHED, PERMANENTLY_FAILED or REDUNDANT already: nothing changed.
--   state        the job's state after the call.
--   promoted_id  a job of the group this call moved WAITING -> READY (publish it, broker mode).
--   queue, priority  the job's.
-- Locks: the group row (a grouped job), then the job row, as background_job_requeue.
-- Fencing: every write is conditional on the state read under the locks; a PROCESSING job's
--   updated_at is not touched (the reaper still judges its worker's liveness by it).
-- Errors: 31001 / SQLSTATE BQ001 no such job. Idempotent: yes (a second call finds REDUNDANT:
--   'finished'; a second abort request moves abort_requested_at only).
-- Transaction: never commits. From a console:
--   START TRANSACTION; CALL background_job_cancel(42, 'customer left', NULL); COMMIT;
CREATE PROCEDURE background_job_cancel(
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
    DECLARE v_outcome VARCHAR(16) DEFAULT 'finished';
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

    IF v_state IN (-1, 1, 4, 6, 8) THEN
        UPDATE background_job
        SET
            state = 7,
            error_message = CONCAT('Cancelled: ', COALESCE(p_reason, '')),
            postponed_by = NULL,
            finished_at = v_now,
            updated_at = v_now
        WHERE id = p_id AND state IN (-1, 1, 4, 6, 8);
        SET v_outcome = 'cancelled';
        IF v_group IS NOT NULL THEN
            CALL background_job_group_wake(v_group, v_now, v_promoted);
        END IF;
    ELSEIF v_state = 2 THEN
        UPDATE background_job
        SET
            abort_requested_at = v_now,
            error_message = CONCAT('Cancelled: ', COALESCE(p_reason, ''))
        WHERE id = p_id AND state = 2;
        SET v_outcome = 'abort_requested';
    END IF;

    SELECT
        v_outcome AS outcome,
        state,
        v_promoted AS promoted_id,
        queue,
        priority
    FROM background_job
    WHERE id = p_id;
END
