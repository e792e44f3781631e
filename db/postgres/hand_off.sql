-- bgq {{ table }}_hand_off, version 1 (PostgreSQL 15)
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
    c RECORD;
BEGIN
    IF p_group IS NULL THEN
        RAISE EXCEPTION 'bgq: hand_off needs a group' USING ERRCODE = 'BQ002';
    END IF;

    IF p_results IS NOT NULL THEN
        v_written := {{ table }}_finish_results(p_results, v_now);
    END IF;

    -- The group's head, if it is claimable here (one index dive).
    SELECT h.id INTO v_head
    FROM (
        SELECT g.id, g.priority, g.state, g.queue, g.serial_group, g.created_at, g.last_attempt_at,
            g.postponed_by, g.processed_by_broker
        FROM {{ table }} AS g
        WHERE g.serial_group = p_group AND g.state IN (-1, 1, 4, 6, 8)
        ORDER BY g.priority, g.id
        LIMIT 1
    ) AS h
    WHERE
        h.state IN (1, 4, 6, 8)
        AND h.priority BETWEEN v_min AND v_max
        AND {{ in_queue('h') }}
        AND {{ due('h') }}
        AND NOT EXISTS (
            SELECT 1 FROM {{ table }} AS x WHERE x.serial_group = p_group AND x.state = 2
        );

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
