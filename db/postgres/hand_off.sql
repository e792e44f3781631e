-- bgq {{ table }}_hand_off, version 2 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM {{ table }}_hand_off(p_results, p_group, p_queue, p_pid, p_min_priority,
--                                      p_max_priority, p_waiting_ms, p_worker_id, p_now)
--   A worker finishes a grouped job and claims the group's next head in one call and one
--   transaction: the group never stands idle between them, and no other worker takes it.
--   p_results       NULL, or the results to write first: the JSON of {{ table }}_finish_batch,
--                   written by {{ table }}_finish_results (its errors included).
--   p_group         the serial group whose head is claimed.
--   p_queue         the base queue: the head must be in it or in a sub-queue '<p_queue>_<sub>'.
--   p_pid           the worker's process id (stored for people).
--   p_min_priority, p_max_priority: the head's priority must lie in this range (NULL: no bound).
--   p_waiting_ms    passed to {{ table }}_claim_job (a head that lost a race turns WAITING).
--   p_worker_id     stored in worker_id on the claimed job (NULL: none).
--   p_now           the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: first one row per p_results object, then at most one claimed job
--   id, attempt     the job and, for the claimed job, its claim token for {{ table }}_finish,
--                   {{ table }}_finish_batch or the next {{ table }}_hand_off.
--   callback_name, parameters_json, parameters, queue, priority, serial_group, identifier,
--   mode, coalesce_threshold: the claimed job as stored (NULL on the result rows).
--   finished        on a result row: 1 if written, 0 if fenced out; NULL on the claimed row.
-- Claimable: the group's head (first in (priority, id) among the group's unstarted jobs of
--   every queue and state -1, 1, 4, 6, 8, due or not; one index dive on
--   {{ table }}_pending_head) when it is READY, TEMPORARILY_FAILED, WAITING or BROKER_FAILED, due
--   (as in {{ table }}_due_jobs without a broker), of the queue and priority range, while no
--   job of the group is PROCESSING. Nothing else: order inside a group never bends.
-- Steps: {{ table }}_finish_results writes p_results (the group row locked, the jobs written,
--   copies inserted, the group woken); then the head is claimed through {{ table }}_claim_job,
--   which re-checks it under the group lock (predecessor, UNIQUE duplicate, coalescing) and
--   writes the claim (PROCESSING, attempts + 1, last_attempt_at, pid, worker_id; postponed_by,
--   error_message and metadata cleared). Only a 'claimed' head is returned.
--   The common case takes a shorter way with the same effects: one FINISHED result without a
--   copy, of a NORMAL or UNIQUE job of p_group, in a group with no WAITING job and no waiting
--   head recorded (nothing to wake), whose next head is a NORMAL job without a coalescing
--   threshold, not WAITING: the group row is locked, the result written (fenced), and the head
--   claimed by one UPDATE under that lock (being the head in a group without a PROCESSING job
--   is what {{ table }}_claim_job's predecessor check asks). Anything else goes the long way.
-- Locks: those of {{ table }}_finish_results, then the group row FOR UPDATE SKIP LOCKED (held
--   already when p_results finished a job of the group): a group row another transaction holds
--   is not waited for, and nothing is claimed. Only a group that has no row yet gets it from
--   {{ table }}_claim_job, which waits at most 3 s for a concurrent first claim.
-- Fencing: each result is written only WHERE state = 2 AND number_of_attempts = attempt; the
--   claim is conditional on a claimable state.
-- Errors: SQLSTATE BQ002 (nothing written) when p_group is NULL; those of
--   {{ table }}_finish_results.
-- Idempotent: no (a second call may claim the next head); a claimed job is never claimed again.
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION {{ table }}_hand_off(
    p_results TEXT,
    p_group VARCHAR,
    p_queue VARCHAR,
    p_pid INTEGER,
    p_min_priority INTEGER,
    p_max_priority INTEGER,
    p_waiting_ms INTEGER,
    p_worker_id BIGINT,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    id BIGINT,
    attempt INTEGER,
    callback_name VARCHAR,
    parameters_json JSON,
    parameters BYTEA,
    queue VARCHAR,
    priority INTEGER,
    serial_group VARCHAR,
    identifier VARCHAR,
    mode VARCHAR,
    coalesce_threshold BIGINT,
    finished INTEGER
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_min INTEGER := COALESCE(p_min_priority, -2147483648);
    v_max INTEGER := COALESCE(p_max_priority, 2147483647);
    v_written TEXT := '[]';
    v_head BIGINT;
    v_claimed BIGINT;
    v_r JSON;
    v_id BIGINT;
    v_job_group VARCHAR;
    v_job_mode VARCHAR;
    v_waiting_head BIGINT;
    v_finished INTEGER;
    v_head_state SMALLINT;
    v_head_mode VARCHAR;
    v_head_threshold BIGINT;
    c RECORD;
BEGIN
    IF p_group IS NULL THEN
        RAISE EXCEPTION 'bgq: hand_off needs a group' USING ERRCODE = 'BQ002';
    END IF;

    -- The short way (see Steps): one FINISHED result without a copy, of a job of p_group.
    IF p_results IS NOT NULL AND JSON_TYPEOF(p_results::JSON) = 'array'
        AND JSON_ARRAY_LENGTH(p_results::JSON) = 1 THEN
        v_r := p_results::JSON -> 0;
        v_id := (v_r ->> 'id')::BIGINT;
        IF (v_r ->> 'state')::INTEGER = 3 AND v_r ->> 'clone_delay_ms' IS NULL THEN
            -- serial_group and mode never change: a plain read.
            SELECT j.serial_group, j.mode INTO v_job_group, v_job_mode
            FROM {{ table }} AS j WHERE j.id = v_id;
        END IF;
    END IF;
    IF v_job_group = p_group AND v_job_mode IN ('normal', 'unique') THEN
        INSERT INTO {{ table }}_group AS g (serial_group, updated_at) VALUES (p_group, v_now)
        ON CONFLICT (serial_group) DO UPDATE SET updated_at = EXCLUDED.updated_at
        RETURNING g.waiting_head_id INTO v_waiting_head;
        IF v_waiting_head IS NULL AND NOT EXISTS (
            SELECT 1 FROM {{ table }} AS w WHERE w.serial_group = p_group AND w.state = 6
        ) THEN
            -- As {{ table }}_finish_results writes a FINISHED result.
            UPDATE {{ table }} AS j
            SET state = 3,
                error_message = r.error,
                postponed_by = r.postponed_by,
                execution_time = r.execution_time,
                memory = r.memory,
                finished_at = v_now,
                updated_at = v_now
            FROM JSON_TO_RECORDSET(p_results::JSON) AS r (
                id BIGINT, attempt INTEGER, error TEXT, postponed_by INTEGER,
                execution_time INTEGER, memory JSON
            )
            WHERE j.id = v_id AND j.state = 2 AND j.number_of_attempts = r.attempt;
            v_finished := CASE WHEN FOUND THEN 1 ELSE 0 END;

            -- The group's head, if it is claimable here (one index dive).
            SELECT h.id, h.state, h.mode, h.coalesce_threshold
            INTO v_head, v_head_state, v_head_mode, v_head_threshold
            FROM (
                SELECT g.id, g.priority, g.state, g.queue, g.serial_group, g.created_at,
                    g.last_attempt_at, g.postponed_by, g.processed_by_broker, g.mode,
                    g.coalesce_threshold
                FROM {{ table }} AS g
                WHERE g.serial_group = p_group AND {{ unstarted('g') }}
                ORDER BY g.priority, g.id
                LIMIT 1
            ) AS h
            WHERE
                {{ head_claimable('h', 'p_group') | indent(16) }};
            IF v_head IS NULL OR (
                v_head_state IN (1, 4, 8) AND v_head_mode = 'normal' AND v_head_threshold IS NULL
            ) THEN
                RETURN QUERY
                SELECT
                    v_id, NULL::INTEGER, NULL::VARCHAR, NULL::JSON, NULL::BYTEA, NULL::VARCHAR,
                    NULL::INTEGER, NULL::VARCHAR, NULL::VARCHAR, NULL::VARCHAR, NULL::BIGINT,
                    v_finished;
                IF v_head IS NOT NULL THEN
                    -- The same columns as {{ table }}_claim_job writes.
                    RETURN QUERY
                    UPDATE {{ table }} AS j
                    SET {{ claim_write() | indent(24) }}
                    WHERE j.id = v_head AND j.state IN (1, 4, 8)
                    RETURNING
                        j.id, j.number_of_attempts, j.callback_name, j.parameters_json,
                        j.parameters, j.queue, j.priority, j.serial_group, j.identifier, j.mode,
                        j.coalesce_threshold, NULL::INTEGER;
                END IF;
                RETURN;
            END IF;
            -- The head needs the long way: claim it as below (the result is written).
            v_written := CASE
                WHEN v_finished = 1 THEN JSON_BUILD_ARRAY(JSON_BUILD_OBJECT('id', v_id))::TEXT
                ELSE '[]'
            END;
            p_results := JSON_BUILD_ARRAY(JSON_BUILD_OBJECT('id', v_id))::TEXT;
            v_job_group := NULL;
            v_head := NULL;
        ELSE
            v_job_group := NULL;
            v_written := NULL;
        END IF;
    ELSE
        v_written := NULL;
    END IF;

    IF p_results IS NOT NULL AND v_written IS NULL THEN
        v_written := {{ table }}_finish_results(p_results, v_now);
    END IF;
    v_written := COALESCE(v_written, '[]');

    -- The group's head, if it is claimable here (one index dive).
    SELECT h.id INTO v_head
    FROM (
        SELECT g.id, g.priority, g.state, g.queue, g.serial_group, g.created_at, g.last_attempt_at,
            g.postponed_by, g.processed_by_broker
        FROM {{ table }} AS g
        WHERE g.serial_group = p_group AND {{ unstarted('g') }}
        ORDER BY g.priority, g.id
        LIMIT 1
    ) AS h
    WHERE
        {{ head_claimable('h', 'p_group') | indent(8) }};

    IF v_head IS NOT NULL THEN
        -- The group row without waiting: this transaction holds it already when p_results
        -- finished a job of the group; one another transaction holds is left alone.
        PERFORM 1 FROM {{ table }}_group AS g
        WHERE g.serial_group = p_group
        FOR UPDATE SKIP LOCKED;
        IF FOUND OR NOT EXISTS (SELECT 1 FROM {{ table }}_group AS g WHERE g.serial_group = p_group) THEN
            SELECT * INTO c
            FROM {{ table }}_claim_job(v_head, p_queue, p_pid, p_waiting_ms, NULL, p_worker_id, v_now);
            IF c.o_outcome = 'claimed' THEN
                v_claimed := v_head;
            END IF;
        END IF;
    END IF;

    RETURN QUERY
    SELECT
        r.id,
        NULL::INTEGER,
        NULL::VARCHAR,
        NULL::JSON,
        NULL::BYTEA,
        NULL::VARCHAR,
        NULL::INTEGER,
        NULL::VARCHAR,
        NULL::VARCHAR,
        NULL::VARCHAR,
        NULL::BIGINT,
        CASE WHEN w.id IS NULL THEN 0 ELSE 1 END
    FROM JSON_TO_RECORDSET(COALESCE(p_results, '[]')::JSON) AS r (id BIGINT)
    LEFT JOIN JSON_TO_RECORDSET(v_written::JSON) AS w (id BIGINT) ON w.id = r.id;

    RETURN QUERY
    SELECT
        j.id,
        j.number_of_attempts,
        j.callback_name,
        j.parameters_json,
        j.parameters,
        j.queue,
        j.priority,
        j.serial_group,
        j.identifier,
        j.mode,
        j.coalesce_threshold,
        NULL::INTEGER
    FROM {{ table }} AS j
    WHERE j.id = v_claimed AND j.state = 2;
END;
$$;
