-- bgq {{ table }}_finish_results, version 5 (PostgreSQL 15)
--
-- Contract
--   SELECT {{ table }}_finish_results(p_results, p_now) -> o_written
--   The one place where results are written: {{ table }}_finish (one job), {{ table }}_finish_batch
--   (many) and {{ table }}_hand_off (many, then the group's next head) are thin wrappers over it.
--   p_results  JSON text: an array of objects, each id at most once:
--              {"id", "attempt", "state", "error", "postponed_by", "execution_time", "memory",
--               "clone_delay_ms"}
--              id, attempt: the job and its claim token (the `attempt` of the claim).
--              state: 3 FINISHED, 4 TEMPORARILY_FAILED, 5 PERMANENTLY_FAILED, 7 REDUNDANT, or
--                1 READY, which gives back a job that was claimed but never started
--                (attempts - 1, pid and metadata cleared; last_attempt_at, execution_time and
--                memory stay). A job whose attempt {{ table }}_cancel asked to stop while it
--                was held is not given back: it is written REDUNDANT (finished_at set, its
--                'Cancelled: <reason>' kept, attempts and pid as claimed) and its group woken.
--              error: error_message to store (NULL on success).
--              postponed_by: ms before the job may run again (a temporary failure's backoff).
--              execution_time: ms the callback took; memory: a JSON object (NULL when the
--                callback did not succeed).
--              clone_delay_ms: NULL, or: insert a fresh copy of the job (same callback,
--                parameters, queue, priority, group, identifier, mode, coalesce_threshold,
--                processed_by_broker; READY, attempts 0, postponed_by this many ms) unless an
--                unfinished job (not 3, 5, 7) of the same identifier and queue exists. Used for
--                RECURRING jobs that finished and for WaitingException. A FINISHED RECURRING
--                job's own row is then deleted, so one row per identifier remains.
--   p_now      the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: OUT parameter, no rows: o_written, JSON text, an array with one object per result
--   that was written (the others were fenced out), in no particular order:
--   {"id", "promoted_id", "clone_id"}: promoted_id is the job of the group that
--   {{ table }}_group_wake moved WAITING -> READY after the group's results (on the group's last
--   written result), clone_id the copy inserted for clone_delay_ms; each NULL when none.
-- Steps: the states are checked, then every FINISHED RECURRING result that would be written
--   must carry a clone_delay_ms (so no recurring job silently stops recurring); the group rows
--   of the grouped jobs are locked; each job is updated only while it is still PROCESSING under
--   the caller's claim (finished_at set for FINISHED and REDUNDANT); the copies are inserted;
--   each group with a written result is woken ({{ table }}_group_wake: a TEMPORARILY_FAILED
--   head is normally still first in line, so it wakes nobody; a better-priority job that waited
--   behind it while it ran is promoted). Released jobs NOTIFY the channel named like the table,
--   so idle workers look again.
-- Locks: the group rows of the grouped jobs, in serial_group order (upserts), then the job rows
--   (the same order as the claims), then promoted rows. (The MySQL twin goes one group at a
--   time: its row, its jobs, its promoted row; a group's row comes before its jobs' on both.)
-- Fencing: each row is written only WHERE state = 2 AND number_of_attempts = attempt. A worker
--   whose job was reaped and claimed again elsewhere presents an old token: nothing changes,
--   and no copy is made, no group woken.
-- Errors: SQLSTATE BQ002 (raised before anything is written; as every error in PostgreSQL, it
--   aborts the caller's transaction) when a state is not 1, 3, 4, 5 or 7, or when a FINISHED
--   RECURRING job would be written without a clone_delay_ms.
-- Idempotent: yes (a repeated call is fenced out: nothing written).
-- Group row: every claim of a group's job writes the group's row (the MySQL twin's rule, for
--   Galera, where a row lock holds on one node only); here the row is locked or upserted as
--   before: version 5 changes nothing in this file but the version.
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION {{ table }}_finish_results(
    p_results TEXT,
    p_now TIMESTAMPTZ,
    OUT o_written TEXT
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_group VARCHAR;
    v_released BOOLEAN;
    v_w_ids BIGINT[];
    v_w_groups VARCHAR[];
    v_w_states INTEGER[];
    v_w_delays INTEGER[];
    v_clones BIGINT[] := '{}';
    v_promoted_groups VARCHAR[] := '{}';
    v_promoted_ids BIGINT[] := '{}';
    v_promoted BIGINT;
    v_clone BIGINT;
    v_identifier VARCHAR;
    v_queue VARCHAR;
    v_mode VARCHAR;
    -- The ids first: every statement below then reaches the jobs by primary key (the planner
    -- knows nothing of a JSON document's size and might scan the table otherwise).
    v_ids BIGINT [] := ARRAY(SELECT r.id FROM JSON_TO_RECORDSET(p_results::JSON) AS r (id BIGINT));
BEGIN
    IF EXISTS (
        SELECT 1 FROM JSON_TO_RECORDSET(p_results::JSON) AS r (state INTEGER)
        WHERE r.state IS NULL OR r.state NOT IN (1, 3, 4, 5, 7)
    ) THEN
        RAISE EXCEPTION 'bgq: a result state must be 1, 3, 4, 5 or 7' USING ERRCODE = 'BQ002';
    END IF;
    IF EXISTS (
        SELECT 1
        FROM JSON_TO_RECORDSET(p_results::JSON) AS r (
            id BIGINT, attempt INTEGER, state INTEGER, clone_delay_ms INTEGER
        )
        INNER JOIN {{ table }} AS j ON j.id = r.id
        WHERE
            j.id = ANY(v_ids)
            AND r.state = 3
            AND r.clone_delay_ms IS NULL
            AND j.mode = 'recurring'
            AND j.state = 2
            AND j.number_of_attempts = r.attempt
    ) THEN
        RAISE EXCEPTION 'bgq: a finished recurring job needs clone_delay_ms, the delay of its successor'
        USING ERRCODE = 'BQ002';
    END IF;

    INSERT INTO {{ table }}_group (serial_group, updated_at)
    SELECT DISTINCT j.serial_group, v_now
    FROM {{ table }} AS j
    WHERE j.id = ANY(v_ids) AND j.serial_group IS NOT NULL
    ORDER BY 1
    ON CONFLICT (serial_group) DO UPDATE SET updated_at = EXCLUDED.updated_at;

    -- A give-back (state 1) of a job whose attempt was cancelled while it was held is written
    -- as the cancelled job it is (REDUNDANT), not handed out again.
{% set cancelled_give_back %}(r.state = 1 AND {{ abort_requested('j') }}){% endset %}
    WITH written AS (
        UPDATE {{ table }} AS j
        SET {{ result_write(cancelled_give_back) | indent(12) }}
        FROM JSON_TO_RECORDSET(p_results::JSON) AS r (
            id BIGINT,
            attempt INTEGER,
            state INTEGER,
            error TEXT,
            postponed_by INTEGER,
            execution_time INTEGER,
            memory JSON,
            clone_delay_ms INTEGER
        )
        WHERE j.id = r.id AND j.id = ANY(v_ids) AND j.state = 2 AND j.number_of_attempts = r.attempt
        RETURNING j.id, j.serial_group, j.state, r.clone_delay_ms
    )
    SELECT
        COALESCE(ARRAY_AGG(w.id ORDER BY w.serial_group, w.id), '{}'),
        COALESCE(ARRAY_AGG(w.serial_group ORDER BY w.serial_group, w.id), '{}'),
        COALESCE(ARRAY_AGG(w.state ORDER BY w.serial_group, w.id), '{}'),
        COALESCE(ARRAY_AGG(w.clone_delay_ms ORDER BY w.serial_group, w.id), '{}')
    INTO v_w_ids, v_w_groups, v_w_states, v_w_delays
    FROM written AS w;
    v_released := 1 = ANY(v_w_states);

    -- The copies (RECURRING, WaitingException), one written job at a time.
    FOR i IN 1 .. COALESCE(ARRAY_LENGTH(v_w_ids, 1), 0) LOOP
        v_clone := NULL;
        IF v_w_delays[i] IS NOT NULL THEN
            SELECT j.identifier, j.queue, j.mode INTO v_identifier, v_queue, v_mode
            FROM {{ table }} AS j WHERE j.id = v_w_ids[i];
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
                    v_w_delays[i], j.processed_by_broker, v_now
                FROM {{ table }} AS j
                WHERE j.id = v_w_ids[i]
                RETURNING id INTO v_clone;
            END IF;
            IF v_mode = 'recurring' AND v_w_states[i] = 3 THEN
                DELETE FROM {{ table }} AS j WHERE j.id = v_w_ids[i];
            END IF;
        END IF;
        v_clones := v_clones || v_clone;
    END LOOP;

    -- Each group with a written result, in serial_group order (the order of its row lock).
    FOR v_group IN
        SELECT DISTINCT g.serial_group
        FROM UNNEST(v_w_groups) AS g (serial_group)
        WHERE g.serial_group IS NOT NULL
        ORDER BY 1
    LOOP
        v_promoted := {{ table }}_group_wake(v_group, v_now);
        IF v_promoted IS NOT NULL THEN
            v_promoted_groups := v_promoted_groups || v_group;
            v_promoted_ids := v_promoted_ids || v_promoted;
        END IF;
    END LOOP;
    IF v_released THEN
        PERFORM PG_NOTIFY('{{ table }}', '');
    END IF;

    SELECT
        COALESCE(
            JSON_AGG(
                JSON_BUILD_OBJECT(
                    'id', w.id,
                    'promoted_id', CASE WHEN w.last_of_group THEN p.promoted_id END,
                    'clone_id', w.clone_id
                )
                ORDER BY w.id
            ),
            '[]'
        )::TEXT
    INTO o_written
    FROM (
        SELECT
            u.id,
            u.serial_group,
            u.clone_id,
            u.id = MAX(u.id) OVER (PARTITION BY u.serial_group) AS last_of_group
        FROM UNNEST(v_w_ids, v_w_groups, v_clones) AS u (id, serial_group, clone_id)
    ) AS w
    LEFT JOIN UNNEST(v_promoted_groups, v_promoted_ids) AS p (serial_group, promoted_id)
        ON p.serial_group = w.serial_group;
END;
$$;
