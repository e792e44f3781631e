-- bgq {{ table }}_finish, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM {{ table }}_finish(p_id, p_attempt, p_state, p_error, p_postponed_by,
--                                    p_execution_time, p_memory, p_clone_delay_ms, p_now)
--   p_id              the job.
--   p_attempt         the claim token returned by {{ table }}_claim (its `attempt`).
--   p_state           the outcome: 3 FINISHED, 4 TEMPORARILY_FAILED, 5 PERMANENTLY_FAILED or
--                     7 REDUNDANT.
--   p_error           error_message to store (NULL on success).
--   p_postponed_by    ms before the job may run again (the backoff of a temporary failure).
--   p_execution_time  ms the callback took (NULL when it did not succeed).
--   p_memory          JSON text {"before": ..., "after": ...} (NULL when it did not succeed).
--   p_now             the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: exactly one row
--   finished           1 if the result was written, 0 if the caller no longer owns the job.
--   promoted_id        the group's WAITING head that this finish moved to READY, or NULL.
--   promoted_queue, promoted_priority: where to publish promoted_id in broker mode.
--   clone_id           the copy inserted for p_clone_delay_ms, or NULL (it has the job's queue
--                      and priority; publish it with delay p_clone_delay_ms in broker mode).
-- Steps: a grouped job locks its group row first; the job is updated only while it is still
--   PROCESSING under the caller's claim; finished_at is set for FINISHED and REDUNDANT; then
--   {{ table }}_group_wake promotes the group's WAITING head when nothing blocks it any more
--   (a TEMPORARILY_FAILED job is normally still first in line, so it wakes nobody; a
--   better-priority job that waited behind it while it ran is promoted).
-- Locks: the group row, then the job row, then the promoted row (the same order as the claim).
-- Fencing: WHERE state = 2 AND number_of_attempts = p_attempt. A worker whose job was reaped
--   and claimed again elsewhere presents an old token: finished = 0 and nothing changes.
-- Errors: SQLSTATE BQ002 when p_state is not 3, 4, 5 or 7 (raised before anything is written;
--   as every error in PostgreSQL, it aborts the caller's transaction).
-- Idempotent: yes (a repeated call is fenced out: finished = 0).
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION {{ table }}_finish(
    p_id BIGINT,
    p_attempt INTEGER,
    p_state INTEGER,
    p_error TEXT,
    p_postponed_by INTEGER,
    p_execution_time INTEGER,
    p_memory TEXT,
    p_clone_delay_ms INTEGER,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    finished INTEGER,
    promoted_id BIGINT,
    promoted_queue VARCHAR,
    promoted_priority INTEGER,
    clone_id BIGINT
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_group VARCHAR;
    v_finished INTEGER := 0;
    v_promoted BIGINT;
    v_clone BIGINT;
    v_identifier VARCHAR;
    v_queue VARCHAR;
    v_mode VARCHAR;
BEGIN
    IF p_state IS NULL OR p_state NOT IN (3, 4, 5, 7) THEN
        RAISE EXCEPTION 'bgq: finish state must be 3, 4, 5 or 7' USING ERRCODE = 'BQ002';
    END IF;

    SELECT j.serial_group INTO v_group FROM {{ table }} AS j WHERE j.id = p_id;
    IF v_group IS NOT NULL THEN
        INSERT INTO {{ table }}_group (serial_group, updated_at) VALUES (v_group, v_now)
        ON CONFLICT (serial_group) DO UPDATE SET updated_at = EXCLUDED.updated_at;
    END IF;

    UPDATE {{ table }} AS j
    SET state = p_state,
        error_message = p_error,
        postponed_by = p_postponed_by,
        execution_time = p_execution_time,
        memory = p_memory::JSON,
        finished_at = CASE WHEN p_state IN (3, 7) THEN v_now ELSE j.finished_at END,
        updated_at = v_now
    WHERE j.id = p_id AND j.state = 2 AND j.number_of_attempts = p_attempt;
    GET DIAGNOSTICS v_finished = ROW_COUNT;

    IF v_finished > 0 AND p_clone_delay_ms IS NOT NULL THEN
        SELECT j.identifier, j.queue, j.mode INTO v_identifier, v_queue, v_mode
        FROM {{ table }} AS j WHERE j.id = p_id;
        IF v_identifier IS NULL OR NOT EXISTS (
            SELECT 1 FROM {{ table }} AS u
            WHERE u.identifier = v_identifier AND u.queue = v_queue AND u.state NOT IN (3, 5, 7)
        ) THEN
            INSERT INTO {{ table }} (
                queue, priority, callback_name, parameters, parameters_json, state, created_at,
                number_of_attempts, serial_group, coalesce_threshold, identifier, mode,
                postponed_by, processed_by_broker, updated_at
            )
            SELECT
                j.queue, j.priority, j.callback_name, j.parameters, j.parameters_json, 1, v_now,
                0, j.serial_group, j.coalesce_threshold, j.identifier, j.mode,
                p_clone_delay_ms, j.processed_by_broker, v_now
            FROM {{ table }} AS j
            WHERE j.id = p_id
            RETURNING id INTO v_clone;
        END IF;
        IF v_mode = 'recurring' AND p_state = 3 THEN
            DELETE FROM {{ table }} AS j WHERE j.id = p_id;
        END IF;
    END IF;

    IF v_finished > 0 AND v_group IS NOT NULL THEN
        v_promoted := {{ table }}_group_wake(v_group, v_now);
    END IF;

    RETURN QUERY
    SELECT
        v_finished,
        v_promoted,
        p.queue,
        p.priority,
        v_clone
    FROM (SELECT v_promoted AS id) AS k
    LEFT JOIN {{ table }} AS p ON p.id = k.id;
END;
$$;
