-- bgq {{ table }}_claim_ids, version 2 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM {{ table }}_claim_ids(p_ids, p_queue, p_pid, p_waiting_ms, p_worker_id, p_now)
--   Broker mode's batch claim: the jobs of a batch of messages, each claimed as {{ table }}_claim
--   would claim it, in one call.
--   p_ids         JSON text: an array of distinct job ids, claimed in the order given.
--   p_queue       the base queue: a job must be in it or in a sub-queue '<p_queue>_<sub>'.
--   p_pid         the worker's process id (stored for people, never used for liveness).
--   p_waiting_ms  postponed_by written when a job has to wait (waiting_job_expiration).
--   p_worker_id   stored in worker_id on every claimed job (NULL: none).
--   p_now         the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: one row per id, in the order given
--   id              the job.
--   outcome, attempt, state, predecessor_id, promoted_id, callback_name, parameters_json,
--   parameters, queue, priority, serial_group, identifier, mode, coalesce_threshold: as
--   documented in {{ table }}_claim, for this job; one more outcome: 'deferred', a grouped job
--   after the first one (nothing changed; state NULL): claim it with {{ table }}_claim in a
--   transaction of its own: a transaction that holds several groups' locks deadlocks with the
--   claims and finishes of other workers (they take group rows in another order).
-- Steps: an ungrouped job that is not UNIQUE, is in the queue, claimable (-1, 1, 4, 6, 8) and not
--   paused (macros/rules.sql not_paused) is claimed by one UPDATE for all of them, of the columns
--   {{ table }}_claim_job writes (PROCESSING, attempts + 1, last_attempt_at, pid, worker_id;
--   postponed_by, error_message and metadata cleared): for such a job {{ table }}_claim_job
--   would do exactly that. Every other id goes through {{ table }}_claim_job, in the order
--   given (the group lock, predecessor, UNIQUE duplicate, coalescing, group wake-up: its Steps),
--   except the grouped ones after the first ('deferred').
-- Locks: the ungrouped jobs' rows (the UPDATE waits for a row another transaction holds, then
--   re-checks it), then those of {{ table }}_claim_job for each other id (one group row at most,
--   waiting at most {{ group_lock_wait_s }} s, then the job row). All last until the end of the
--   caller's transaction.
-- Fencing: every write is conditional on a claimable state; a job claimed elsewhere first is
--   'unexpected' or 'skipped' here and nothing is written for it.
-- Errors: none of its own. Idempotent: a second call on the same ids finds them claimed
--   ('unexpected').
-- Group row: every claim of a group's job writes the group's row (the MySQL twin's rule, for
--   Galera, where a row lock holds on one node only); here the row is locked or upserted as
--   before: version 2 changes nothing in this file but the version.
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION {{ table }}_claim_ids(
    p_ids TEXT,
    p_queue VARCHAR,
    p_pid INTEGER,
    p_waiting_ms INTEGER,
    p_worker_id BIGINT,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    id BIGINT,
    outcome TEXT,
    attempt INTEGER,
    state SMALLINT,
    predecessor_id BIGINT,
    promoted_id BIGINT,
    callback_name VARCHAR,
    parameters_json JSON,
    parameters BYTEA,
    queue VARCHAR,
    priority INTEGER,
    serial_group VARCHAR,
    identifier VARCHAR,
    mode VARCHAR,
    coalesce_threshold BIGINT
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_ids BIGINT [] := ARRAY(
        SELECT e.value::BIGINT
        FROM JSON_ARRAY_ELEMENTS_TEXT(p_ids::JSON) WITH ORDINALITY AS e (value, pos)
        ORDER BY e.pos
    );
    v_fast BIGINT [];
    v_outcomes TEXT [] := '{}';
    v_states SMALLINT [] := '{}';
    v_predecessors BIGINT [] := '{}';
    v_promoted BIGINT [] := '{}';
    v_grouped BOOLEAN := FALSE;
    c RECORD;
BEGIN
    WITH claimed AS (
        UPDATE {{ table }} AS j
        SET {{ claim_write() | indent(12) }}
        WHERE
            j.id = ANY(v_ids)
            AND j.serial_group IS NULL
            AND j.mode <> 'unique'
            AND {{ unstarted('j') }}
            AND {{ in_queue('j') }}
            AND {{ not_paused('j') }}
        RETURNING j.id
    )

    SELECT COALESCE(ARRAY_AGG(claimed.id), '{}') INTO v_fast FROM claimed;

    FOR i IN 1 .. COALESCE(ARRAY_LENGTH(v_ids, 1), 0) LOOP
        IF v_ids[i] = ANY(v_fast) THEN
            v_outcomes := v_outcomes || 'claimed'::TEXT;
            v_states := v_states || 2::SMALLINT;
            v_predecessors := v_predecessors || NULL::BIGINT;
            v_promoted := v_promoted || NULL::BIGINT;
        ELSIF v_grouped AND EXISTS (
            SELECT 1 FROM {{ table }} AS j WHERE j.id = v_ids[i] AND j.serial_group IS NOT NULL
        ) THEN
            v_outcomes := v_outcomes || 'deferred'::TEXT;
            v_states := v_states || NULL::SMALLINT;
            v_predecessors := v_predecessors || NULL::BIGINT;
            v_promoted := v_promoted || NULL::BIGINT;
        ELSE
            SELECT * INTO c
            FROM {{ table }}_claim_job(v_ids[i], p_queue, p_pid, p_waiting_ms, NULL, p_worker_id, v_now);
            v_outcomes := v_outcomes || c.o_outcome;
            v_states := v_states || c.o_state;
            v_predecessors := v_predecessors || c.o_predecessor_id;
            v_promoted := v_promoted || c.o_promoted_id;
            v_grouped := v_grouped OR EXISTS (
                SELECT 1 FROM {{ table }} AS j WHERE j.id = v_ids[i] AND j.serial_group IS NOT NULL
            );
        END IF;
    END LOOP;

    RETURN QUERY
    SELECT
        r.id,
        r.outcome,
        CASE WHEN r.outcome = 'claimed' THEN j.number_of_attempts END,
        r.state,
        r.predecessor_id,
        r.promoted_id,
        j.callback_name,
        j.parameters_json,
        j.parameters,
        j.queue,
        j.priority,
        j.serial_group,
        j.identifier,
        j.mode,
        j.coalesce_threshold
    FROM UNNEST(v_ids, v_outcomes, v_states, v_predecessors, v_promoted)
        WITH ORDINALITY AS r (id, outcome, state, predecessor_id, promoted_id, pos)
    LEFT JOIN {{ table }} AS j ON j.id = r.id AND r.outcome NOT IN ('missing', 'deferred')
    ORDER BY r.pos;
END;
$$;
