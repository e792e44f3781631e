-- bgq {{ table }}_hand_off, version 4 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM {{ table }}_hand_off(p_results, p_groups, p_queue, p_pid, p_min_priority,
--                                      p_max_priority, p_waiting_ms, p_worker_id, p_now)
--   A worker writes its results and claims the next head of each of its groups in one call and
--   one transaction: a group it hands on never stands idle between its job and the next, and no
--   other worker takes it. `bgq work` writes every batch of results this way.
--   p_results       NULL, or the results to write first: the JSON of {{ table }}_finish_batch.
--   p_groups        JSON text: an array of serial group names (duplicates and nulls ignored),
--                   the groups whose next head is claimed; [] claims nothing.
--   p_queue         the base queue: a head must be in it or in a sub-queue '<p_queue>_<sub>'.
--   p_pid           the worker's process id (stored for people).
--   p_min_priority, p_max_priority: a head's priority must lie in this range (NULL: no bound).
--   p_waiting_ms    passed to {{ table }}_claim_job (a head that lost a race turns WAITING).
--   p_worker_id     stored in worker_id on every claimed job (NULL: none).
--   p_now           the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: first one row per p_results object, then at most one claimed job per group (in no
--   particular order)
--   id, attempt     the job and, for a claimed job, its claim token for {{ table }}_finish,
--                   {{ table }}_finish_batch or the next {{ table }}_hand_off.
--   callback_name, parameters_json, parameters, queue, priority, serial_group, identifier,
--   mode, coalesce_threshold: the claimed job as stored (NULL on the result rows).
--   finished        on a result row: 1 if written, 0 if fenced out; NULL on a claimed row.
-- Claimable: a group's head (first in (priority, id) among the group's unstarted jobs of every
--   queue and state -1, 1, 4, 6, 8, due or not; one index dive on {{ table }}_pending_head)
--   when it is READY, TEMPORARILY_FAILED, WAITING or BROKER_FAILED, due (as in
--   {{ table }}_due_jobs without a broker), of the queue and priority range, while no job of
--   the group is PROCESSING. Nothing else: order inside a group never bends.
-- Steps: the results are written by {{ table }}_finish_results' writer (result_write in
--   macros/rules.sql), then the heads are claimed. Three ways, with the same effects:
--   - the short way, a lone group's chain: one FINISHED result without a copy, of a NORMAL or
--     UNIQUE job of the one group of p_groups: the group row locked (upsert), the job written
--     (fenced), the group woken if it has a WAITING job or a recorded waiting head
--     ({{ table }}_group_wake), and its head claimed, by plain statements;
--   - the batch way, when every result is FINISHED without a copy and no job is RECURRING: the
--     group rows of the results' groups locked (upserts, in serial_group order), the jobs
--     written by one UPDATE (fenced), each group with a WAITING job or a recorded waiting head
--     woken; then the group rows of p_groups locked without waiting, and the heads of the
--     locked groups claimed together;
--   - any other batch goes through {{ table }}_finish_results (its errors included), then the
--     heads are claimed as in the batch way.
--   A head is claimed under its group lock: a NORMAL head without a coalescing threshold, not
--   WAITING, by an UPDATE of the columns {{ table }}_claim_job writes (PROCESSING, attempts + 1,
--   last_attempt_at, pid, worker_id; postponed_by, error_message and metadata cleared; being
--   the head in a group without a PROCESSING job is what its predecessor check asks); any other
--   head, and the head of a group without a row yet, through {{ table }}_claim_job, which
--   re-checks it under the group lock (predecessor, UNIQUE duplicate, coalescing). Only
--   'claimed' heads are returned.
-- Locks: the group rows of the results' groups (upserts, in serial_group order: a result waits
--   for its group row), then the job rows, then the group rows of p_groups FOR UPDATE SKIP
--   LOCKED (held already for a group whose job p_results finished): a group row another
--   transaction holds is not waited for, and that group's head is left alone. Only a group that
--   has no row yet gets it from {{ table }}_claim_job, which waits at most
--   {{ group_lock_wait_s }} s for a concurrent first claim.
-- Fencing: each result is written only WHERE state = 2 AND number_of_attempts = attempt; each
--   claim is conditional on a claimable state.
-- Errors: SQLSTATE BQ002 (nothing written) when p_groups is not a JSON array; those of
--   {{ table }}_finish_results.
-- Idempotent: no (a second call may claim the next heads); a claimed job is never claimed again.
-- Group row: every claim of a group's job writes the group's row (the MySQL twin's rule, for
--   Galera, where a row lock holds on one node only); here the row is locked or upserted as
--   before: version 4 changes nothing in this file but the version.
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
{#- The plain FINISHED results among `ids` written by the one result writer: a
    WITH clause whose `written` returns the ids written (fenced: still PROCESSING under the
    result's claim). -#}
{% macro write_finished(ids) -%}
WITH written AS (
    UPDATE {{ table }} AS j
    SET {{ result_write(finished=True) | indent(8) }}
    FROM JSON_TO_RECORDSET(COALESCE(p_results, '[]')::JSON) AS r (
        id BIGINT, attempt INTEGER, error TEXT, postponed_by INTEGER, execution_time INTEGER,
        memory JSON
    )
    WHERE
        j.id = r.id
        AND r.id = ANY({{ ids }})
        -- (Not a condition an index could serve: the jobs are reached by primary key, never by
        -- a scan of every PROCESSING job.)
        AND (j.state = 2 AND j.number_of_attempts = r.attempt) IS TRUE
    RETURNING j.id, j.serial_group
)
{%- endmacro %}
CREATE OR REPLACE FUNCTION {{ table }}_hand_off(
    p_results TEXT,
    p_groups TEXT,
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
-- Every statement here reaches a few rows by key (the results' jobs, the groups' heads): each is
-- planned once per session, never as a sequential scan (a plan made while the tables were small
-- would read every row of a grown table until an ANALYZE replans it), and written so that no
-- plan can reach them but by key (a condition on a job's state is written `(...) IS TRUE` where
-- an index on state could otherwise be chosen over the primary key: a scan of every PROCESSING
-- job, and of the dead index entries every finished job leaves behind until the next vacuum).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_min INTEGER := COALESCE(p_min_priority, -2147483648);
    v_max INTEGER := COALESCE(p_max_priority, 2147483647);
    v_groups VARCHAR[];
    v_ids BIGINT[];
    v_plain BOOLEAN;
    v_wake VARCHAR[] := '{}';
    v_written BIGINT[] := '{}';
    v_claimed BIGINT[];
    v_free VARCHAR[] := '{}';
    v_group VARCHAR;
    c RECORD;
    v_gs JSON;
    v_rs JSON;
    v_r JSON;
    v_id BIGINT;
    v_job_group VARCHAR;
    v_job_mode VARCHAR;
    v_waiting_head BIGINT;
    v_finished INTEGER;
    v_head BIGINT;
    v_returned INTEGER;
BEGIN
    -- The short way (see Steps) for a lone group's chain, in a few plain statements: one
    -- FINISHED result without a copy, of a NORMAL or UNIQUE job of the one group of p_groups.
    v_gs := p_groups::JSON;
    v_rs := p_results::JSON;
    IF JSON_TYPEOF(v_gs) = 'array' AND JSON_ARRAY_LENGTH(v_gs) = 1
        AND JSON_TYPEOF(v_rs) = 'array' AND JSON_ARRAY_LENGTH(v_rs) = 1 THEN
        v_r := v_rs -> 0;
        v_group := v_gs ->> 0;
        v_id := (v_r ->> 'id')::BIGINT;
    END IF;
    IF v_group IS NOT NULL AND (v_r ->> 'state')::INTEGER = 3 AND v_r ->> 'clone_delay_ms' IS NULL THEN
        -- The job's group and mode (they never change: a plain read).
        SELECT j.serial_group, j.mode INTO v_job_group, v_job_mode
        FROM {{ table }} AS j WHERE j.id = v_id;
    END IF;
    IF v_job_group = v_group AND v_job_mode IN ('normal', 'unique') THEN
        -- The group row (the lock every result and claim of the group takes), then the result.
        INSERT INTO {{ table }}_group AS g (serial_group, updated_at) VALUES (v_group, v_now)
        ON CONFLICT (serial_group) DO UPDATE SET updated_at = EXCLUDED.updated_at
        RETURNING g.waiting_head_id INTO v_waiting_head;
        UPDATE {{ table }} AS j
        SET {{ result_write(finished=True) | indent(12) }}
        FROM JSON_TO_RECORD(v_r) AS r (
            attempt INTEGER, error TEXT, postponed_by INTEGER, execution_time INTEGER, memory JSON
        )
        WHERE j.id = v_id AND j.state = 2 AND j.number_of_attempts = r.attempt;
        v_finished := CASE WHEN FOUND THEN 1 ELSE 0 END;
    ELSE
        v_group := NULL;  -- the batch way below
    END IF;
    IF v_group IS NOT NULL THEN
        IF v_waiting_head IS NOT NULL OR EXISTS (
            SELECT 1 FROM {{ table }} AS w WHERE w.serial_group = v_group AND w.state = 6
        ) THEN
            PERFORM {{ table }}_group_wake(v_group, v_now);
        END IF;
        -- The result's row, and the group's head claimed if it is a plain one and claimable
        -- here (one index dive), under the group lock: the columns {{ table }}_claim_job writes.
        RETURN QUERY
        WITH claimed AS (
            UPDATE {{ table }} AS j
            SET {{ claim_write() | indent(16) }}
            WHERE
                j.id = {{ group_head_id('v_group') | indent(16) }}
                AND {{ claimable_not_waiting('j') }}
                AND j.mode = 'normal'
                AND j.coalesce_threshold IS NULL
                AND j.priority BETWEEN v_min AND v_max
                AND {{ in_queue('j') | indent(16) }}
                AND {{ due('j') | indent(16) }}
                -- (a written result was the group's PROCESSING job: the group is free)
                AND (v_finished = 1 OR {{ no_job_running('v_group') }})
            RETURNING
                j.id, j.number_of_attempts, j.callback_name, j.parameters_json, j.parameters,
                j.queue, j.priority, j.serial_group, j.identifier, j.mode, j.coalesce_threshold
        )
        SELECT
            v_id, NULL::INTEGER, NULL::VARCHAR, NULL::JSON, NULL::BYTEA, NULL::VARCHAR,
            NULL::INTEGER, NULL::VARCHAR, NULL::VARCHAR, NULL::VARCHAR, NULL::BIGINT, v_finished
        UNION ALL
        SELECT c.*, NULL::INTEGER FROM claimed AS c;
        GET DIAGNOSTICS v_returned = ROW_COUNT;
        IF v_returned = 1 THEN
            -- Nothing claimed: a head that needs {{ table }}_claim_job (WAITING, UNIQUE,
            -- RECURRING, coalescing), if the group has one claimable here.
            SELECT h.id INTO v_head
            FROM (
                SELECT g.id, g.priority, g.state, g.queue, g.serial_group, g.created_at,
                    g.last_attempt_at, g.postponed_by, g.processed_by_broker
                FROM {{ table }} AS g
                WHERE g.serial_group = v_group AND {{ unstarted('g') }}
                ORDER BY g.priority, g.id
                LIMIT 1
            ) AS h
            WHERE
                {{ head_claimable('h', 'v_group') | indent(16) }};
            IF v_head IS NOT NULL THEN
                SELECT * INTO c
                FROM {{ table }}_claim_job(v_head, p_queue, p_pid, p_waiting_ms, NULL, p_worker_id, v_now);
                IF c.o_outcome = 'claimed' THEN
                    RETURN QUERY
                    SELECT
                        j.id, j.number_of_attempts, j.callback_name, j.parameters_json,
                        j.parameters, j.queue, j.priority, j.serial_group, j.identifier, j.mode,
                        j.coalesce_threshold, NULL::INTEGER
                    FROM {{ table }} AS j
                    WHERE j.id = v_head;
                END IF;
            END IF;
        END IF;
        RETURN;
    END IF;

    -- The groups; the results' ids and groups (a job's group and mode never change: a plain
    -- read, by primary key), and whether every result is a plain FINISHED one (see Steps); the
    -- results' group rows locked, in serial_group order (a result waits for its group row), and
    -- which of those groups have a WAITING job or a recorded waiting head to wake.
    WITH r AS (
        SELECT r.id, r.state, r.clone_delay_ms, j.serial_group, j.mode
        FROM JSON_TO_RECORDSET(COALESCE(p_results, '[]')::JSON) AS r (id BIGINT, state INTEGER, clone_delay_ms INTEGER)
        LEFT JOIN LATERAL (
            SELECT x.serial_group, x.mode FROM {{ table }} AS x WHERE x.id = r.id LIMIT 1
        ) AS j ON TRUE
    ),
    locked AS (
        INSERT INTO {{ table }}_group AS g (serial_group, updated_at)
        SELECT DISTINCT r.serial_group, v_now FROM r WHERE r.serial_group IS NOT NULL
        ORDER BY 1
        ON CONFLICT (serial_group) DO UPDATE SET updated_at = EXCLUDED.updated_at
        RETURNING g.serial_group, g.waiting_head_id
    )
    SELECT
        CASE WHEN JSON_TYPEOF(p_groups::JSON) = 'array' THEN
            ARRAY(SELECT JSON_ARRAY_ELEMENTS_TEXT(p_groups::JSON))
        END,
        ARRAY(SELECT r.id FROM r),
        COALESCE(
            (SELECT BOOL_AND(r.state = 3 AND r.clone_delay_ms IS NULL AND r.mode IS DISTINCT FROM 'recurring') FROM r),
            TRUE
        ),
        ARRAY(
            SELECT l.serial_group FROM locked AS l
            -- (a scalar subquery, probed per group: an EXISTS here may be planned as a hashed
            -- subplan that reads every WAITING job)
            WHERE l.waiting_head_id IS NOT NULL OR (
                SELECT 1 FROM {{ table }} AS w WHERE w.serial_group = l.serial_group AND w.state = 6 LIMIT 1
            ) IS NOT NULL
        )
    INTO v_groups, v_ids, v_plain, v_wake;
    IF v_groups IS NULL THEN
        RAISE EXCEPTION 'bgq: hand_off needs a JSON array of groups' USING ERRCODE = 'BQ002';
    END IF;
    -- The results written, then the groups woken; the claims below see both. A group whose
    -- result was written has no PROCESSING job (that job was it), and its row is held.
    IF v_plain THEN
        {{ write_finished('v_ids') | indent(8) }}
        SELECT COALESCE(ARRAY_AGG(w.id), '{}'), COALESCE(ARRAY_AGG(w.serial_group), '{}')
        INTO v_written, v_free
        FROM written AS w;
        FOREACH v_group IN ARRAY v_wake LOOP
            PERFORM {{ table }}_group_wake(v_group, v_now);
        END LOOP;
    ELSE
        v_written := ARRAY(
            SELECT w.id
            FROM JSON_TO_RECORDSET({{ table }}_finish_results(p_results, v_now)::JSON) AS w (id BIGINT)
        );
    END IF;

    v_claimed := {{ table }}_claim_heads(
        v_groups, v_free, p_queue, p_pid, p_min_priority, p_max_priority, p_waiting_ms, p_worker_id,
        v_now
    );

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
        CASE WHEN r.id = ANY(v_written) THEN 1 ELSE 0 END
    FROM UNNEST(v_ids) AS r (id)
    UNION ALL
    (
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
        WHERE j.id = ANY(v_claimed) AND (j.state = 2) IS TRUE
        ORDER BY j.priority, j.id
    );
END;
$$;
