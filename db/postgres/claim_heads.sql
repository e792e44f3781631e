-- bgq {{ table }}_claim_heads, version 2 (PostgreSQL 15)
--
-- Contract
--   SELECT {{ table }}_claim_heads(p_groups, p_free, p_queue, p_pid, p_min_priority,
--                                  p_max_priority, p_waiting_ms, p_worker_id, p_now) -> BIGINT[]
--   The one place where the heads of several groups are claimed together: {{ table }}_hand_off
--   (the groups whose jobs it just wrote) and {{ table }}_claim_batch (the groups of the heads it
--   found) call it.
--   p_groups        the serial groups: a VARCHAR[] on PostgreSQL, a JSON array on MySQL (nulls
--                   and repeats ignored).
--   p_free          NULL, or groups of p_groups' kind whose rows the caller holds locked and
--                   whose PROCESSING job it has just written: their rows are not looked up again
--                   and their running index is not read.
--   p_queue, p_pid, p_min_priority, p_max_priority, p_waiting_ms, p_worker_id, p_now: as in
--                   {{ table }}_claim_batch.
-- Result: no rows: the ids of the heads claimed, PROCESSING now under the caller's claim, in
--   no particular order; PostgreSQL returns them as the function's BIGINT[], MySQL in o_claimed,
--   an OUT parameter holding a JSON array (a nested CALL must send no rows).
-- Claimable: a group's head (first in (priority, id) among the group's unstarted jobs of every
--   queue and state -1, 1, 4, 6, 8, due or not; one index dive on {{ table }}_pending_head)
--   when it is READY, TEMPORARILY_FAILED, WAITING or BROKER_FAILED, due (as in
--   {{ table }}_due_jobs without a broker), of the queue and priority range, while no job of the
--   group is PROCESSING. Nothing else: order inside a group never bends.
-- Steps: the groups that have no row yet (never claimed, or cleared) get one (one INSERT); then
--   the group rows are locked without waiting, and each locked group's head, if it is
--   claimable here, is claimed: a NORMAL head without a coalescing threshold, not WAITING, by
--   one UPDATE for all of them (the columns {{ table }}_claim_job writes: PROCESSING,
--   attempts + 1, last_attempt_at, pid, worker_id; postponed_by, error_message and metadata
--   cleared; being the head of a group without a PROCESSING job is what its predecessor check
--   asks); any other head through {{ table }}_claim_job, which re-checks it under the group
--   lock (predecessor, UNIQUE duplicate, coalescing). Only 'claimed' heads are returned.
-- Locks: the new group rows (an INSERT that waits at most {{ group_lock_wait_s }} s for a
--   concurrent first claim of the same group; past that, the call goes on without those groups),
--   then the group rows FOR UPDATE SKIP LOCKED, in serial_group order (those this transaction holds
--   already are taken as well): a group row another transaction holds is not waited for, and that
--   group's head is left alone. Then the claimed job rows.
-- Fencing: every claim is conditional on a claimable state.
-- Errors: none of its own. Idempotent: no (a second call may claim the next heads).
-- Group row: every claim of a group's job writes the group's row (the MySQL twin's rule, for
--   Galera, where a row lock holds on one node only); here the row is locked or upserted as
--   before: version 2 changes nothing in this file but the version.
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION {{ table }}_claim_heads(
    p_groups VARCHAR[],
    p_free VARCHAR[],
    p_queue VARCHAR,
    p_pid INTEGER,
    p_min_priority INTEGER,
    p_max_priority INTEGER,
    p_waiting_ms INTEGER,
    p_worker_id BIGINT,
    p_now TIMESTAMPTZ
)
RETURNS BIGINT[]
LANGUAGE plpgsql
VOLATILE
-- Every statement here reaches a few rows by key: planned once per session (the plans do not
-- depend on the values), and never as a sequential scan: a plan made while the tables were
-- small (a worker that started on a new install) would otherwise read every row of a grown
-- table until an ANALYZE replans it. A condition on a job's state is written `(...) IS TRUE`
-- where an index on state could otherwise be chosen over the primary key (a scan of every
-- PROCESSING job, and of the dead index entries every finished job leaves behind until the next
-- vacuum).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET lock_timeout = '{{ group_lock_wait_s }}s'
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_min INTEGER := COALESCE(p_min_priority, -2147483648);
    v_max INTEGER := COALESCE(p_max_priority, 2147483647);
    v_free VARCHAR [] := COALESCE(p_free, '{}');
    v_locked VARCHAR [];
    v_claimed BIGINT [];
    v_long BIGINT [];
    c RECORD;
BEGIN
    -- (Counted, not anti-joined: a join could hash the whole group table.)
    IF (SELECT COUNT(*) FROM {{ table }}_group AS r WHERE r.serial_group = ANY(p_groups))
        < (SELECT COUNT(DISTINCT g.name) FROM UNNEST(p_groups) AS g (name) WHERE g.name IS NOT NULL)
    THEN
        BEGIN
            INSERT INTO {{ table }}_group (serial_group, updated_at)
            SELECT DISTINCT g.name, v_now FROM UNNEST(p_groups) AS g (name)
            WHERE g.name IS NOT NULL
            ORDER BY 1
            ON CONFLICT (serial_group) DO NOTHING;
        EXCEPTION WHEN lock_not_available THEN
            NULL;  -- a concurrent first claim holds one of them: those groups wait for later
        END;
    END IF;

    v_locked := ARRAY(
        SELECT g.serial_group FROM {{ table }}_group AS g
        WHERE g.serial_group = ANY(p_groups)
        ORDER BY g.serial_group
        FOR UPDATE SKIP LOCKED
    );

    WITH heads AS (
        SELECT h.id, h.state, h.mode, h.coalesce_threshold
        FROM UNNEST(v_locked) AS l (name)
        CROSS JOIN LATERAL (
            SELECT g.id, g.priority, g.state, g.queue, g.serial_group, g.created_at,
                g.last_attempt_at, g.postponed_by, g.processed_by_broker, g.mode,
                g.coalesce_threshold
            FROM {{ table }} AS g
            WHERE g.serial_group = l.name AND {{ unstarted('g') }}
            ORDER BY g.priority, g.id
            LIMIT 1
        ) AS h
        WHERE
            {{ claimable('h') }}
            AND h.priority BETWEEN v_min AND v_max
            AND {{ in_queue('h') }}
            AND {{ due('h') | indent(12) }}
            AND (l.name = ANY(v_free) OR {{ no_job_running('l.name') }})
    ),

    plain AS (
        UPDATE {{ table }} AS j
        SET {{ claim_write() | indent(12) }}
        FROM heads AS h
        WHERE
            j.id = h.id
            AND {{ claimable_not_waiting('h') }}
            AND h.mode = 'normal'
            AND h.coalesce_threshold IS NULL
            AND ({{ claimable_not_waiting('j') }}) IS TRUE
        RETURNING j.id
    )

    SELECT
        ARRAY(SELECT p.id FROM plain AS p),
        ARRAY(
            SELECT h.id FROM heads AS h
            WHERE NOT ({{ plain_head('h') }})
            ORDER BY h.id
        )
    INTO v_claimed, v_long;

    FOR i IN 1 .. COALESCE(ARRAY_LENGTH(v_long, 1), 0) LOOP
        SELECT * INTO c
        FROM {{ table }}_claim_job(v_long[i], p_queue, p_pid, p_waiting_ms, NULL, p_worker_id, v_now);
        IF c.o_outcome = 'claimed' THEN
            v_claimed := v_claimed || v_long[i];
        END IF;
    END LOOP;
    RETURN v_claimed;
END;
$$;
