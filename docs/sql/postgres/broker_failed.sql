-- bgq background_job_broker_failed, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_broker_failed(p_id, p_error, p_now)
--   p_id     the job whose id could not be sent to the broker.
--   p_error  why (the producer's error message), stored as error_message.
--   p_now    the clock (TIMESTAMPTZ); NULL means clock_timestamp().
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
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION background_job_broker_failed(
    p_id BIGINT,
    p_error TEXT,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    changed INTEGER
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_changed INTEGER := 0;
BEGIN
    UPDATE background_job AS j
    SET state = 8, error_message = p_error, updated_at = v_now
    WHERE j.id = p_id AND j.state IN (-1, 1, 4);
    GET DIAGNOSTICS v_changed = ROW_COUNT;

    RETURN QUERY SELECT v_changed;
END;
$$;
