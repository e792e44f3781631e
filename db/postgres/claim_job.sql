-- bgq {{ table }}_claim_job, version 4 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM {{ table }}_claim_job(p_id, p_queue, p_pid, p_waiting_ms, p_metadata,
--                                       p_worker_id, p_now)
--   The one place where a single job is claimed: {{ table }}_claim (cron and broker mode),
--   {{ table }}_claim_batch (grouped heads and UNIQUE jobs) and {{ table }}_hand_off call it.
--   Parameters as in {{ table }}_claim.
-- Result: OUT parameters, no rows: a nested CALL must not send any
--   o_outcome, o_attempt, o_state, o_predecessor_id, o_promoted_id: outcome, attempt, state,
--   predecessor_id and promoted_id as documented in {{ table }}_claim.
-- Steps, Locks, Fencing, Errors, Idempotent: as documented in {{ table }}_claim (the group row
--   waits at most {{ group_lock_wait_s }} s: this function is declared SET lock_timeout =
--   '{{ group_lock_wait_s }}s', which PostgreSQL restores when it returns, also on error).
-- Group row: every claim of a group's job writes the group's row (the MySQL twin's rule, for
--   Galera, where a row lock holds on one node only); here the row is locked or upserted as
--   before: version 4 changes nothing in this file but the version.
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION {{ table }}_claim_job(
    p_id BIGINT,
    p_queue VARCHAR,
    p_pid INTEGER,
    p_waiting_ms INTEGER,
    p_metadata TEXT,
    p_worker_id BIGINT,
    p_now TIMESTAMPTZ,
    OUT o_outcome TEXT,
    OUT o_attempt INTEGER,
    OUT o_state SMALLINT,
    OUT o_predecessor_id BIGINT,
    OUT o_promoted_id BIGINT
)
LANGUAGE plpgsql
VOLATILE
SET lock_timeout = '{{ group_lock_wait_s }}s'
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_group VARCHAR;
    v_mode VARCHAR;
    v_identifier VARCHAR;
    v_threshold BIGINT;
    v_before SMALLINT;
BEGIN
    <<body>>
    BEGIN
        -- serial_group, mode and identifier never change, so a plain read is enough here.
        SELECT j.serial_group, j.mode, j.identifier INTO v_group, v_mode, v_identifier
        FROM {{ table }} AS j
        WHERE j.id = p_id
          AND {{ in_queue('j') }};
        IF NOT FOUND THEN
            o_outcome := 'missing';
            EXIT body;
        END IF;

        IF v_group IS NOT NULL THEN
            BEGIN
                INSERT INTO {{ table }}_group (serial_group, updated_at) VALUES (v_group, v_now)
                ON CONFLICT (serial_group) DO UPDATE SET updated_at = EXCLUDED.updated_at;
            EXCEPTION WHEN lock_not_available THEN
                o_outcome := 'locked';
                EXIT body;
            END;
        END IF;

        SELECT j.state, j.number_of_attempts, j.coalesce_threshold
        INTO o_state, o_attempt, v_threshold
        FROM {{ table }} AS j
        WHERE j.id = p_id
        FOR UPDATE;
        IF NOT FOUND THEN
            o_outcome := 'missing';
            o_state := NULL;
            EXIT body;
        END IF;
        o_attempt := NULL;
        v_before := o_state;
        IF o_state IN (3, 7) THEN
            o_outcome := 'skipped';
            EXIT body;
        END IF;
        IF NOT {{ unstarted(column='o_state') }} THEN
            o_outcome := 'unexpected';
            EXIT body;
        END IF;
        -- A paused queue or group (macros/rules.sql not_paused): nothing changes.
        IF NOT EXISTS (SELECT 1 FROM {{ table }} AS j WHERE j.id = p_id AND {{ not_paused('j') }}) THEN
            o_outcome := 'paused';
            EXIT body;
        END IF;

        IF v_mode = 'unique' AND EXISTS (
            SELECT 1 FROM {{ table }} AS o
            WHERE o.identifier = v_identifier AND o.id < p_id
              AND {{ in_queue('o') }}
        ) THEN
            UPDATE {{ table }} AS j
            SET state = 7, finished_at = v_now, updated_at = v_now
            WHERE j.id = p_id;
            o_outcome := 'redundant';
            o_state := 7;
        ELSIF v_group IS NOT NULL THEN
            o_predecessor_id := {{ table }}_predecessor(p_id);
            IF o_predecessor_id IS NOT NULL THEN
                UPDATE {{ table }} AS j
                SET state = 6,
                    error_message = 'Waiting for job ID ' || o_predecessor_id,
                    postponed_by = p_waiting_ms,
                    updated_at = v_now
                WHERE j.id = p_id AND {{ unstarted('j') }};
                o_outcome := 'waiting';
                o_state := 6;
            END IF;
        END IF;

        IF o_outcome IS NULL THEN
            UPDATE {{ table }} AS j
            SET {{ claim_write(metadata='p_metadata::JSON') | indent(16) }}
            WHERE j.id = p_id AND {{ unstarted('j') }};
            SELECT j.number_of_attempts INTO o_attempt FROM {{ table }} AS j WHERE j.id = p_id;
            o_outcome := 'claimed';
            o_state := 2;
            IF v_threshold IS NOT NULL AND v_group IS NOT NULL THEN
                UPDATE {{ table }} AS j
                SET state = 7, finished_at = v_now, updated_at = v_now
                WHERE j.serial_group = v_group
                  AND {{ unstarted('j') }}
                  AND j.id <> p_id
                  AND j.coalesce_threshold >= v_threshold;
            END IF;
        END IF;

        -- A plain claim of a job that was not WAITING changes neither the group's waiting head
        -- nor what may be promoted (the group now runs a job): no wake needed.
        IF v_group IS NOT NULL AND NOT (o_outcome = 'claimed' AND v_before <> 6 AND v_threshold IS NULL) THEN
            o_promoted_id := {{ table }}_group_wake(v_group, v_now);
        END IF;
    END body;
END;
$$;
