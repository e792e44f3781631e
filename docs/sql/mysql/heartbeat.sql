-- bgq background_job_heartbeat, version 3 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_heartbeat(p_id, p_attempt, p_metadata, p_now)
--   p_id       the job the caller is running.
--   p_attempt  the claim token returned by background_job_claim (its `attempt`).
--   p_metadata JSON text to store in metadata as well (NULL: metadata unchanged); `bgq work`
--              stores on_processing_get_metadata's value this way when a batched job starts.
--   p_now      the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: exactly one row
--   alive  1 if the job is still PROCESSING under the caller's claim (its updated_at is now
--          p_now); 0 if it is not (no such job, reaped, claimed again with a newer token,
--          finished, or moved by a person): nothing changed.
--   abort_requested  1 if the job is alive and background_job_cancel asked, during this attempt
--          (abort_requested_at >= last_attempt_at), that it stop; else 0. The worker then
--          raises bgq.JobAborted in the callback and records REDUNDANT with the reason.
--   reason  the job's error_message when abort_requested is 1 ('Cancelled: <reason>'), else NULL.
-- The worker's proof of life for a long callback: the reaper (background_job_reap) judges liveness by
--   updated_at only, so a job whose worker calls this more often than stalled_job_timeout is
--   never reaped. Nothing but updated_at (and metadata, if given) changes; no queue filter.
-- Locks: the job row only, until the caller commits (call it in a short transaction of its own,
--   never one held across the callback). The row is read with a locking read before the
--   UPDATE, so `alive` does not depend on the client's CLIENT_FOUND_ROWS flag when p_now equals
--   the stored updated_at.
-- Fencing: WHERE state = 2 AND number_of_attempts = p_attempt. A worker whose job was reaped and
--   claimed again elsewhere presents an old token and cannot keep the new claim alive; a
--   finished job is never touched. A reaper that got there first wins (the row is no longer
--   PROCESSING); a heartbeat that got there first makes the reaper skip the row (its fence on
--   updated_at fails).
-- Errors: none. Idempotent: yes (a repeated call only moves updated_at to the newer clock).
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE background_job_heartbeat(
    IN p_id BIGINT UNSIGNED,
    IN p_attempt INT,
    IN p_metadata LONGTEXT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_alive INT DEFAULT 0;
    DECLARE v_abort INT DEFAULT 0;
    DECLARE v_reason TEXT DEFAULT NULL;

    SELECT
        COUNT(*) AS alive,
        COALESCE(
            MAX(CASE WHEN abort_requested_at >= last_attempt_at THEN 1 ELSE 0 END), 0
        ) AS abort_requested,
        MAX(CASE WHEN abort_requested_at >= last_attempt_at THEN error_message END) AS reason
    INTO v_alive, v_abort, v_reason
    FROM background_job
    WHERE id = p_id AND state = 2 AND number_of_attempts = p_attempt
    FOR UPDATE;

    IF v_alive > 0 THEN
        UPDATE background_job
        SET updated_at = v_now, metadata = COALESCE(p_metadata, metadata)
        WHERE id = p_id AND state = 2 AND number_of_attempts = p_attempt;
    END IF;

    SELECT
        v_alive AS alive,
        v_abort AS abort_requested,
        v_reason AS reason;
END
