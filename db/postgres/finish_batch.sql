-- bgq {{ table }}_finish_batch, version 2 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM {{ table }}_finish_batch(p_results, p_now)
--   p_results  JSON text: an array of objects, each id at most once:
--              {"id", "attempt", "state", "error", "postponed_by", "execution_time", "memory"}
--              with the meaning of {{ table }}_finish's parameters (memory is a JSON object),
--              and one more state: 1 READY gives back a job that was claimed but never
--              started (attempts - 1, pid and metadata cleared; last_attempt_at stays).
--   p_now      the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: one row per input object
--   id        the job.
--   finished  1 if the result was written, 0 if the caller no longer owns the job.
-- The batched form of {{ table }}_finish for `bgq work`: one statement writes every result.
--   What it does not do: clones. A WaitingException's copy or a finished RECURRING job's
--   successor needs {{ table }}_finish (p_clone_delay_ms); a FINISHED RECURRING job here is an
--   error, so no recurring job can silently stop recurring. A grouped job's group is woken
--   ({{ table }}_group_wake) as by {{ table }}_finish. Released jobs NOTIFY the channel named
--   like the table, so idle workers look again.
-- Locks: the group rows of the grouped jobs, in serial_group order (upserts), then the job rows.
-- Fencing: each row is written only WHERE state = 2 AND number_of_attempts = attempt.
-- Errors: SQLSTATE BQ002 (nothing written) when a state is not 1, 3, 4, 5 or 7, or when a
--   FINISHED RECURRING job would be written here.
-- Idempotent: yes (a repeated call is fenced out: finished = 0).
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION {{ table }}_finish_batch(
    p_results TEXT,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    id BIGINT,
    finished INTEGER
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_written BIGINT[];
    v_group VARCHAR;
    v_released BOOLEAN;
BEGIN
    IF EXISTS (
        SELECT 1 FROM JSON_TO_RECORDSET(p_results::JSON) AS r (state INTEGER)
        WHERE r.state IS NULL OR r.state NOT IN (1, 3, 4, 5, 7)
    ) THEN
        RAISE EXCEPTION 'bgq: finish_batch state must be 1, 3, 4, 5 or 7' USING ERRCODE = 'BQ002';
    END IF;
    IF EXISTS (
        SELECT 1
        FROM JSON_TO_RECORDSET(p_results::JSON) AS r (id BIGINT, attempt INTEGER, state INTEGER)
        INNER JOIN {{ table }} AS j ON j.id = r.id
        WHERE r.state = 3 AND j.mode = 'recurring' AND j.state = 2 AND j.number_of_attempts = r.attempt
    ) THEN
        RAISE EXCEPTION 'bgq: a finished recurring job needs finish, which inserts its successor'
        USING ERRCODE = 'BQ002';
    END IF;

    INSERT INTO {{ table }}_group (serial_group, updated_at)
    SELECT DISTINCT j.serial_group, v_now
    FROM JSON_TO_RECORDSET(p_results::JSON) AS r (id BIGINT)
    INNER JOIN {{ table }} AS j ON j.id = r.id
    WHERE j.serial_group IS NOT NULL
    ORDER BY 1
    ON CONFLICT (serial_group) DO UPDATE SET updated_at = EXCLUDED.updated_at;

    WITH written AS (
        UPDATE {{ table }} AS j
        SET state = r.state,
            number_of_attempts = CASE
                WHEN r.state = 1 THEN j.number_of_attempts - 1 ELSE j.number_of_attempts
            END,
            error_message = r.error,
            postponed_by = r.postponed_by,
            execution_time = CASE WHEN r.state = 1 THEN j.execution_time ELSE r.execution_time END,
            memory = CASE WHEN r.state = 1 THEN j.memory ELSE r.memory END,
            pid = CASE WHEN r.state = 1 THEN NULL ELSE j.pid END,
            metadata = CASE WHEN r.state = 1 THEN NULL ELSE j.metadata END,
            finished_at = CASE WHEN r.state IN (3, 7) THEN v_now ELSE j.finished_at END,
            updated_at = v_now
        FROM JSON_TO_RECORDSET(p_results::JSON) AS r (
            id BIGINT,
            attempt INTEGER,
            state INTEGER,
            error TEXT,
            postponed_by INTEGER,
            execution_time INTEGER,
            memory JSON
        )
        WHERE j.id = r.id AND j.state = 2 AND j.number_of_attempts = r.attempt
        RETURNING j.id, r.state
    )
    SELECT COALESCE(ARRAY_AGG(written.id), '{}'), COALESCE(BOOL_OR(written.state = 1), FALSE)
    INTO v_written, v_released
    FROM written;

    FOR v_group IN
        SELECT DISTINCT j.serial_group
        FROM {{ table }} AS j
        WHERE j.id = ANY(v_written) AND j.serial_group IS NOT NULL
        ORDER BY 1
    LOOP
        PERFORM {{ table }}_group_wake(v_group, v_now);
    END LOOP;
    IF v_released THEN
        PERFORM PG_NOTIFY('{{ table }}', '');
    END IF;

    RETURN QUERY
    SELECT r.id, CASE WHEN r.id = ANY(v_written) THEN 1 ELSE 0 END
    FROM JSON_TO_RECORDSET(p_results::JSON) AS r (id BIGINT);
END;
$$;
