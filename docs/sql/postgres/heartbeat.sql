-- bgq background_job_heartbeat, version 3 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_heartbeat(p_id, p_attempt, p_metadata, p_now)
--   p_id       the job the caller is running.
--   p_attempt  the claim token returned by background_job_claim (its `attempt`).
--   p_metadata JSON text to store in metadata as well (NULL: metadata unchanged); `bgq work`
--              stores on_processing_get_metadata's value this way when a batched job starts.
--   p_now      the clock (TIMESTAMPTZ); NULL means clock_timestamp().
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
--   never one held across the callback). ROW_COUNT counts the rows the UPDATE matched, so
--   `alive` is 1 even when p_now equals the stored updated_at.
-- Fencing: WHERE state = 2 AND number_of_attempts = p_attempt. A worker whose job was reaped and
--   claimed again elsewhere presents an old token and cannot keep the new claim alive; a
--   finished job is never touched. A reaper that got there first wins (the row is no longer
--   PROCESSING); a heartbeat that got there first makes the reaper skip the row (its fence on
--   updated_at fails).
-- Errors: none. Idempotent: yes (a repeated call only moves updated_at to the newer clock).
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the lock lasts until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION background_job_heartbeat(
    p_id BIGINT,
    p_attempt INTEGER,
    p_metadata TEXT,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    alive INTEGER,
    abort_requested INTEGER,
    reason TEXT
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_alive INTEGER := 0;
    v_abort INTEGER := 0;
    v_reason TEXT;
BEGIN
    UPDATE background_job AS j
    SET updated_at = v_now, metadata = COALESCE(p_metadata::JSON, j.metadata)
    WHERE j.id = p_id AND j.state = 2 AND j.number_of_attempts = p_attempt
    RETURNING
        CASE WHEN j.abort_requested_at >= j.last_attempt_at THEN 1 ELSE 0 END,
        CASE WHEN j.abort_requested_at >= j.last_attempt_at THEN j.error_message END
    INTO v_abort, v_reason;
    GET DIAGNOSTICS v_alive = ROW_COUNT;

    RETURN QUERY SELECT v_alive, COALESCE(v_abort, 0), v_reason;
END;
$$;
