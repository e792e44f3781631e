-- bgq {{ table }}_finish_results, version 2 (PostgreSQL 15)
--
-- Contract
--   SELECT {{ table }}_finish_results(p_results, p_now) -> BIGINT[]
--   What {{ table }}_finish_batch does, without its result rows: the one place where batched
--   results are written. {{ table }}_finish_batch and {{ table }}_claim_batch (its p_results)
--   call it. Parameters as in {{ table }}_finish_batch.
-- Result: OUT parameter, no rows: o_written, the ids whose result was written (the others were
--   fenced out).
-- Locks, Fencing, Idempotent, Transaction: as documented in {{ table }}_finish_batch.
-- Errors: SQLSTATE BQ002 (nothing written) when a state is not 1, 3, 4, 5 or 7, or when a
--   FINISHED RECURRING job would be written here.
CREATE OR REPLACE FUNCTION {{ table }}_finish_results(
    p_results TEXT,
    p_now TIMESTAMPTZ,
    OUT o_written BIGINT[]
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_group VARCHAR;
    v_released BOOLEAN;
    -- The ids first: every statement below then reaches the jobs by primary key (the planner
    -- knows nothing of a JSON document's size and might scan the table otherwise).
    v_ids BIGINT [] := ARRAY(SELECT r.id FROM JSON_TO_RECORDSET(p_results::JSON) AS r (id BIGINT));
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
        WHERE
            j.id = ANY(v_ids)
            AND r.state = 3
            AND j.mode = 'recurring'
            AND j.state = 2
            AND j.number_of_attempts = r.attempt
    ) THEN
        RAISE EXCEPTION 'bgq: a finished recurring job needs finish, which inserts its successor'
        USING ERRCODE = 'BQ002';
    END IF;

    INSERT INTO {{ table }}_group (serial_group, updated_at)
    SELECT DISTINCT j.serial_group, v_now
    FROM {{ table }} AS j
    WHERE j.id = ANY(v_ids) AND j.serial_group IS NOT NULL
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
        WHERE j.id = r.id AND j.id = ANY(v_ids) AND j.state = 2 AND j.number_of_attempts = r.attempt
        RETURNING j.id, r.state
    )
    SELECT COALESCE(ARRAY_AGG(written.id), '{}'), COALESCE(BOOL_OR(written.state = 1), FALSE)
    INTO o_written, v_released
    FROM written;

    FOR v_group IN
        SELECT DISTINCT j.serial_group
        FROM {{ table }} AS j
        WHERE j.id = ANY(o_written) AND j.serial_group IS NOT NULL
        ORDER BY 1
    LOOP
        PERFORM {{ table }}_group_wake(v_group, v_now);
    END LOOP;
    IF v_released THEN
        PERFORM PG_NOTIFY('{{ table }}', '');
    END IF;

END;
$$;
