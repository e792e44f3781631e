-- bgq {{ table }}_claim, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM {{ table }}_claim(p_id, p_queue, p_pid, p_waiting_ms, p_metadata, p_now)
--   p_id          the job to claim.
--   p_queue       the base queue: the job must be in it or in a sub-queue '<p_queue>_<sub>'.
--   p_pid         the worker's process id (stored for people, never used for liveness).
--   p_waiting_ms  postponed_by written when the job has to wait (waiting_job_expiration).
--   p_metadata    JSON text stored in metadata on a successful claim (NULL stores NULL).
--   p_now         the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: exactly one row
--   outcome         'claimed'    the job is PROCESSING and belongs to the caller;
--                   'waiting'    a predecessor exists: the job is WAITING (conditional write);
--                   'redundant'  UNIQUE job with an older row of its identifier: REDUNDANT;
--                   'locked'     the group row stayed locked for 3 s: nothing changed;
--                   'missing'    no such job in this queue;
--                   'skipped'    FINISHED or REDUNDANT already (an expected duplicate);
--                   'unexpected' PROCESSING or PERMANENTLY_FAILED: nothing changed.
--   attempt         number_of_attempts after the claim: the fencing token that
--                   {{ table }}_finish must present. NULL unless claimed.
--   state           the job's state after the call (NULL when missing).
--   predecessor_id  the job it waits for ('waiting').
--   promoted_id     a job of the group this call moved WAITING -> READY (publish it).
--   callback_name, parameters_json, parameters, queue, priority, serial_group, identifier,
--   mode, coalesce_threshold: the job as stored (NULL when missing).
-- Steps: a claimable state is -1, 1, 4, 6, 8. A grouped job first locks its group row; then the
--   job is re-read under the lock; a UNIQUE duplicate turns REDUNDANT; a job with a predecessor
--   ({{ table }}_predecessor) turns WAITING; otherwise it is claimed (PROCESSING, attempts + 1,
--   last_attempt_at, pid, metadata; postponed_by and error_message cleared) and, with a
--   coalesce_threshold, swallows the unstarted jobs of its group whose threshold is >= its own
--   (REDUNDANT). {{ table }}_group_wake then refreshes the group row.
-- Locks: the group row (waits at most 3 s: the function is declared SET lock_timeout = '3s',
--   which PostgreSQL restores when the function returns, also on error; lock_not_available,
--   SQLSTATE 55P03, on that one statement is caught in a subtransaction and becomes 'locked'),
--   then the job row (FOR UPDATE). The other reads are plain reads: at READ COMMITTED each
--   statement sees the latest committed rows. The 3 s bound covers every lock wait inside the
--   function: a longer wait elsewhere (the job row of an ungrouped job that another transaction
--   holds) raises SQLSTATE 55P03, which the caller may retry.
-- Fencing: every write is conditional on a claimable state; a job claimed elsewhere first is
--   'unexpected' or 'skipped' here and nothing is written.
-- Errors: none of its own. Idempotent: a second call on a claimed job is 'unexpected'.
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION {{ table }}_claim(
    p_id BIGINT,
    p_queue VARCHAR,
    p_pid INTEGER,
    p_waiting_ms INTEGER,
    p_metadata TEXT,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
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
SET lock_timeout = '3s'
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_outcome TEXT;
    v_group VARCHAR;
    v_mode VARCHAR;
    v_identifier VARCHAR;
    v_state SMALLINT;
    v_attempt INTEGER;
    v_threshold BIGINT;
    v_predecessor BIGINT;
    v_promoted BIGINT;
BEGIN
    <<body>>
    BEGIN
        -- serial_group, mode and identifier never change, so a plain read is enough here.
        SELECT j.serial_group, j.mode, j.identifier INTO v_group, v_mode, v_identifier
        FROM {{ table }} AS j
        WHERE j.id = p_id
          AND (j.queue = p_queue OR LEFT(j.queue, LENGTH(p_queue) + 1) = p_queue || '_');
        IF NOT FOUND THEN
            v_outcome := 'missing';
            EXIT body;
        END IF;

        IF v_group IS NOT NULL THEN
            BEGIN
                INSERT INTO {{ table }}_group (serial_group, updated_at) VALUES (v_group, v_now)
                ON CONFLICT (serial_group) DO UPDATE SET updated_at = EXCLUDED.updated_at;
            EXCEPTION WHEN lock_not_available THEN
                v_outcome := 'locked';
                EXIT body;
            END;
        END IF;

        SELECT j.state, j.number_of_attempts, j.coalesce_threshold
        INTO v_state, v_attempt, v_threshold
        FROM {{ table }} AS j
        WHERE j.id = p_id
        FOR UPDATE;
        IF NOT FOUND THEN
            v_outcome := 'missing';
            v_state := NULL;
            EXIT body;
        END IF;
        v_attempt := NULL;
        IF v_state IN (3, 7) THEN
            v_outcome := 'skipped';
            EXIT body;
        END IF;
        IF v_state NOT IN (-1, 1, 4, 6, 8) THEN
            v_outcome := 'unexpected';
            EXIT body;
        END IF;

        IF v_mode = 'unique' AND EXISTS (
            SELECT 1 FROM {{ table }} AS o
            WHERE o.identifier = v_identifier AND o.id < p_id
              AND (o.queue = p_queue OR LEFT(o.queue, LENGTH(p_queue) + 1) = p_queue || '_')
        ) THEN
            UPDATE {{ table }} AS j
            SET state = 7, finished_at = v_now, updated_at = v_now
            WHERE j.id = p_id;
            v_outcome := 'redundant';
            v_state := 7;
        ELSIF v_group IS NOT NULL THEN
            v_predecessor := {{ table }}_predecessor(p_id);
            IF v_predecessor IS NOT NULL THEN
                UPDATE {{ table }} AS j
                SET state = 6,
                    error_message = 'Waiting for job ID ' || v_predecessor,
                    postponed_by = p_waiting_ms,
                    updated_at = v_now
                WHERE j.id = p_id AND j.state IN (-1, 1, 4, 6, 8);
                v_outcome := 'waiting';
                v_state := 6;
            END IF;
        END IF;

        IF v_outcome IS NULL THEN
            UPDATE {{ table }} AS j
            SET state = 2,
                number_of_attempts = j.number_of_attempts + 1,
                last_attempt_at = v_now,
                pid = p_pid,
                postponed_by = NULL,
                error_message = NULL,
                metadata = p_metadata::JSON,
                updated_at = v_now
            WHERE j.id = p_id AND j.state IN (-1, 1, 4, 6, 8);
            SELECT j.number_of_attempts INTO v_attempt FROM {{ table }} AS j WHERE j.id = p_id;
            v_outcome := 'claimed';
            v_state := 2;
            IF v_threshold IS NOT NULL AND v_group IS NOT NULL THEN
                UPDATE {{ table }} AS j
                SET state = 7, finished_at = v_now, updated_at = v_now
                WHERE j.serial_group = v_group
                  AND j.state IN (-1, 1, 4, 6, 8)
                  AND j.id <> p_id
                  AND j.coalesce_threshold >= v_threshold;
            END IF;
        END IF;

        IF v_group IS NOT NULL THEN
            v_promoted := {{ table }}_group_wake(v_group, v_now);
        END IF;
    END body;

    RETURN QUERY
    SELECT
        v_outcome,
        v_attempt,
        v_state,
        v_predecessor,
        v_promoted,
        j.callback_name,
        j.parameters_json,
        j.parameters,
        j.queue,
        j.priority,
        j.serial_group,
        j.identifier,
        j.mode,
        j.coalesce_threshold
    FROM (SELECT p_id AS id) AS k
    LEFT JOIN {{ table }} AS j ON j.id = k.id AND v_outcome <> 'missing';
END;
$$;
