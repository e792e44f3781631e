-- bgq {{ table }}_claim_batch, version 5 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM {{ table }}_claim_batch(p_queue, p_limit, p_pid, p_min_priority,
--                                         p_max_priority, p_max_heads, p_waiting_ms,
--                                         p_worker_id, p_now)
--   Claims only; a worker that finished a grouped job takes the group's next head with
--   {{ table }}_hand_off instead.
--   p_queue         the base queue: jobs in it or in a sub-queue '<p_queue>_<sub>'.
--   p_limit         at most this many jobs are claimed (>= 1).
--   p_pid           the worker's process id (stored for people).
--   p_min_priority, p_max_priority: only jobs with a priority in this range (NULL: no bound).
--   p_max_heads     at most this many of the claimed jobs are group heads (NULL: p_limit). A
--                   worker that takes one group at a time leaves the other groups' heads to
--                   the other workers.
--   p_waiting_ms    passed to {{ table }}_claim_job (a head that lost a race turns WAITING).
--   p_worker_id     stored in worker_id on every claimed job (NULL: none).
--   p_now           the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: one row per claimed job, ordered by priority then id; each is PROCESSING, the caller's
--   id, attempt     the job and its claim token for {{ table }}_finish, {{ table }}_finish_batch
--                   or {{ table }}_hand_off.
--   callback_name, parameters_json, parameters, queue, priority, serial_group, identifier,
--   mode, coalesce_threshold: the job as stored.
-- Claimable: a due job (as in {{ table }}_due_jobs without a broker: READY, TEMPORARILY_FAILED,
--   WAITING or BROKER_FAILED whose postponement has passed) of the queue and priority range that
--   is either ungrouped, or the head of its group (first in (priority, id) among the group's
--   unstarted jobs of every queue and state -1, 1, 4, 6, 8, due or not) while no job of the
--   group is PROCESSING. A group whose head is not due, or is in another queue or priority
--   range, is skipped as a whole: order inside a group never bends.
-- Steps: candidates are up to p_limit ungrouped jobs (taken FOR UPDATE SKIP LOCKED) and up to
--   2 * n + 2 group heads (n: p_limit, or p_max_heads if smaller), tried in (priority, id) order
--   until p_limit are claimed. The heads come from the first 4 * (2 * n + 2) + 16 claimable
--   grouped jobs in (priority, id) order ({{ table }}_grouped), each checked by one dive on
--   {{ table }}_pending_head; only when those hold too few heads, from one index dive per group
--   (a cost that grows with the groups: every group's first jobs busy or not due). An
--   ungrouped job that is not UNIQUE is claimed by an UPDATE of the same columns
--   {{ table }}_claim_job writes (PROCESSING, attempts + 1, last_attempt_at, pid, worker_id;
--   postponed_by, error_message and metadata cleared). So is a NORMAL group head without a
--   coalescing threshold, not WAITING, once its group row is locked, when it is still the
--   group's head, in the queue and not paused, and no job of the group is PROCESSING: what
--   {{ table }}_claim_job would check and write (the short way). The short way takes the first
--   heads at once: the group rows of up to n heads among the first p_limit candidates are locked
--   in one statement and their claimable heads claimed by one UPDATE; every other candidate is
--   tried one at a time, in order. Any other group head, or a UNIQUE job, goes through
--   {{ table }}_claim_job, which re-checks it under the group lock
--   (predecessor, UNIQUE duplicate, coalescing); only 'claimed' jobs are returned.
-- Locks: ungrouped candidates FOR UPDATE SKIP LOCKED (never waits for them); group rows FOR
--   UPDATE SKIP LOCKED too: a head whose group row another transaction holds (a claim or a
--   finish in progress) is left out and the next candidate is tried, so batch claims neither
--   wait for nor deadlock on each other. Only a group that has no row yet (never claimed) gets
--   it from {{ table }}_claim_job, which waits at most 3 s for a concurrent first claim.
-- Fencing: every write is conditional on a claimable state.
-- Errors: SQLSTATE BQ002 when p_limit is NULL or < 1 (nothing written).
-- Idempotent: no (each call claims more jobs); a claimed job is never claimed again.
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION {{ table }}_claim_batch(
    p_queue VARCHAR,
    p_limit INTEGER,
    p_pid INTEGER,
    p_min_priority INTEGER,
    p_max_priority INTEGER,
    p_max_heads INTEGER,
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
    coalesce_threshold BIGINT
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_min INTEGER := COALESCE(p_min_priority, -2147483648);
    v_max INTEGER := COALESCE(p_max_priority, 2147483647);
    v_ids BIGINT[];
    v_groups VARCHAR[];
    v_modes VARCHAR[];
    v_claimed BIGINT[] := '{}';
    v_heads INTEGER := 0;
    v_head_limit INTEGER := LEAST(p_limit, COALESCE(p_max_heads, p_limit));
    v_head_candidates INTEGER := 2 * LEAST(p_limit, COALESCE(p_max_heads, p_limit)) + 2;
    v_scan INTEGER := 4 * (2 * LEAST(p_limit, COALESCE(p_max_heads, p_limit)) + 2) + 16;
    v_hids BIGINT[];
    v_hpriorities INTEGER[];
    v_hgroups VARCHAR[];
    v_hmodes VARCHAR[];
    v_locked BOOLEAN;
    v_pre_groups VARCHAR[];
    v_pre BIGINT[];
    v_ungrouped_left INTEGER;
    c RECORD;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'bgq: claim_batch limit must be at least 1' USING ERRCODE = 'BQ002';
    END IF;

    -- Up to 2 * n + 2 group heads (n: p_limit, or p_max_heads if smaller; a head whose group
    -- another claim holds is skipped below, and the next one is tried), in (priority, id) order.
    -- First the bounded scan: the first v_scan claimable grouped jobs in (priority, id) order
    -- ({{ table }}_grouped), of which those that are their group's head (its first unstarted
    -- job: one dive on {{ table }}_pending_head) in a group without a PROCESSING job.
    -- Every claimable head is among those jobs, in the same order, so when the scan finds enough
    -- heads, or reads fewer than v_scan jobs (it saw them all), its heads are the first ones.
    SELECT
        ARRAY_AGG(h.id ORDER BY h.priority, h.id),
        ARRAY_AGG(h.priority ORDER BY h.priority, h.id),
        ARRAY_AGG(h.serial_group ORDER BY h.priority, h.id),
        ARRAY_AGG(h.mode ORDER BY h.priority, h.id)
    INTO v_hids, v_hpriorities, v_hgroups, v_hmodes
    FROM (
        SELECT s.id, s.priority, s.serial_group, s.mode
        FROM (
            SELECT
                g.id, g.priority, g.serial_group, g.mode, g.queue, g.created_at,
                g.last_attempt_at, g.postponed_by, g.processed_by_broker
            FROM {{ table }} AS g
            WHERE
                g.serial_group IS NOT NULL
                AND g.state IN (1, 4, 6, 8)
                AND g.priority BETWEEN v_min AND v_max
            ORDER BY g.priority, g.id
            LIMIT v_scan
        ) AS s
        WHERE
            {{ in_queue('s') }}
            AND {{ due('s') }}
            AND s.id = {{ group_head_id('s.serial_group') }}
            AND {{ no_job_running('s.serial_group') }}
        ORDER BY s.priority, s.id
        LIMIT v_head_candidates
    ) AS h;

    -- Too few heads among v_scan jobs (the first ones belong to busy groups, or are not heads):
    -- every group's head, one index dive per group on {{ table }}_pending_head.
    IF COALESCE(ARRAY_LENGTH(v_hids, 1), 0) < v_head_candidates
        AND (
            SELECT COUNT(*) FROM (
                SELECT 1 FROM {{ table }} AS g
                WHERE
                    g.serial_group IS NOT NULL
                    AND g.state IN (1, 4, 6, 8)
                    AND g.priority BETWEEN v_min AND v_max
                LIMIT v_scan
            ) AS n
        ) >= v_scan THEN
        SELECT
            ARRAY_AGG(hh.id ORDER BY hh.priority, hh.id),
            ARRAY_AGG(hh.priority ORDER BY hh.priority, hh.id),
            ARRAY_AGG(hh.serial_group ORDER BY hh.priority, hh.id),
            ARRAY_AGG(hh.mode ORDER BY hh.priority, hh.id)
        INTO v_hids, v_hpriorities, v_hgroups, v_hmodes
        FROM (SELECT h.id, h.priority, h.serial_group, h.mode
            FROM (
                WITH RECURSIVE heads AS (
                    (
                        SELECT
                            g.id, g.priority, g.serial_group, g.mode, g.state, g.queue, g.created_at,
                            g.last_attempt_at, g.postponed_by, g.processed_by_broker
                        FROM {{ table }} AS g
                        WHERE
                            g.serial_group IS NOT NULL
                            AND {{ unstarted('g') }}
                        ORDER BY g.serial_group, g.priority, g.id
                        LIMIT 1
                    )
                    UNION ALL
                    SELECT n.*
                    FROM heads AS h
                    CROSS JOIN LATERAL (
                        SELECT
                            g.id, g.priority, g.serial_group, g.mode, g.state, g.queue, g.created_at,
                            g.last_attempt_at, g.postponed_by, g.processed_by_broker
                        FROM {{ table }} AS g
                        WHERE
                            g.serial_group > h.serial_group
                            AND {{ unstarted('g') }}
                        ORDER BY g.serial_group, g.priority, g.id
                        LIMIT 1
                    ) AS n
                )

                SELECT * FROM heads
            ) AS h
            WHERE
                {{ head_claimable('h', 'h.serial_group') | indent(16) }}
            ORDER BY h.priority, h.id
            LIMIT v_head_candidates) AS hh;
    END IF;

    -- Up to p_limit ungrouped jobs (locked, skipping locked ones) and the heads, in (priority, id)
    -- order.
    SELECT
        ARRAY_AGG(c.id ORDER BY c.priority, c.id),
        ARRAY_AGG(c.serial_group ORDER BY c.priority, c.id),
        ARRAY_AGG(c.mode ORDER BY c.priority, c.id),
        COUNT(*) FILTER (WHERE c.serial_group IS NULL)
    INTO v_ids, v_groups, v_modes, v_ungrouped_left
    FROM (
        SELECT f.id, f.priority, NULL::VARCHAR AS serial_group, f.mode
        FROM (
            SELECT j.id, j.priority, j.mode
            FROM {{ table }} AS j
            WHERE
                j.serial_group IS NULL
                AND j.state IN (1, 4, 6, 8)
                AND j.priority BETWEEN v_min AND v_max
                AND {{ in_queue('j') }}
                AND {{ due('j') }}
            ORDER BY j.priority, j.id
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ) AS f
        UNION ALL
        SELECT u.id, u.priority, u.serial_group, u.mode
        FROM UNNEST(v_hids, v_hpriorities, v_hgroups, v_hmodes) AS u (id, priority, serial_group, mode)
    ) AS c;

    -- The short way for the first heads, as one statement (see Steps): of the first p_limit
    -- candidates, the group rows of up to v_head_limit heads are locked without waiting (a row
    -- another transaction holds is skipped), and the heads of the locked groups that the short
    -- way may claim are claimed by one UPDATE, under those locks. Each ranks among the first
    -- p_limit candidates: counted as claimed from the start, they never keep the loop below
    -- from reaching a candidate ranked before them. The loop takes every other candidate one at
    -- a time, and ends once no candidate left could be claimed.
    SELECT ARRAY_AGG(l.serial_group) INTO v_pre_groups
    FROM (
        SELECT g.serial_group
        FROM {{ table }}_group AS g
        WHERE g.serial_group IN (
            SELECT u.serial_group
            FROM UNNEST(v_groups[1:p_limit]) WITH ORDINALITY AS u (serial_group, o)
            WHERE u.serial_group IS NOT NULL
            ORDER BY u.o
            LIMIT v_head_limit
        )
        FOR UPDATE SKIP LOCKED
    ) AS l;
    IF v_pre_groups IS NOT NULL THEN
        WITH pre AS (
            UPDATE {{ table }} AS j
            SET {{ claim_write() | indent(16) }}
            FROM
                UNNEST(v_ids[1:p_limit], v_groups[1:p_limit], v_modes[1:p_limit])
                    AS u (id, serial_group, mode)
            WHERE
                u.serial_group = ANY(v_pre_groups)
                AND u.mode = 'normal'
                AND j.id = u.id
                AND j.state IN (1, 4, 8)
                AND j.coalesce_threshold IS NULL
                AND {{ in_queue('j') | indent(16) }}
                AND {{ not_paused('j') | indent(16) }}
                AND j.id = {{ group_head_id('u.serial_group') | indent(16) }}
                AND {{ no_job_running('u.serial_group') }}
            RETURNING j.id
        )

        SELECT ARRAY_AGG(pre.id) INTO v_pre FROM pre;
    END IF;
    v_claimed := COALESCE(v_pre, '{}');
    v_heads := COALESCE(ARRAY_LENGTH(v_claimed, 1), 0);

    -- One candidate at a time, in (priority, id) order, until p_limit are claimed. A group's row
    -- is locked without waiting: one that another transaction holds (a claim or a finish in
    -- progress) is skipped, so concurrent batch claims never wait for or deadlock on each other.
    FOR i IN 1 .. COALESCE(ARRAY_LENGTH(v_ids, 1), 0) LOOP
        EXIT WHEN
            COALESCE(ARRAY_LENGTH(v_claimed, 1), 0) >= p_limit
            OR (v_ungrouped_left = 0 AND v_heads >= v_head_limit);
        IF v_groups[i] IS NULL THEN
            v_ungrouped_left := v_ungrouped_left - 1;
        END IF;
        IF v_groups[i] IS NULL AND v_modes[i] <> 'unique' THEN
            -- The same columns as {{ table }}_claim_job writes; the row is locked already.
            UPDATE {{ table }} AS j
            SET {{ claim_write() | indent(16) }}
            WHERE j.id = v_ids[i] AND j.state IN (1, 4, 6, 8);
            IF FOUND THEN
                v_claimed := v_claimed || v_ids[i];
            END IF;
            CONTINUE;
        END IF;
        CONTINUE WHEN v_groups[i] IS NOT NULL AND v_ids[i] = ANY(v_pre);  -- claimed above
        IF v_groups[i] IS NOT NULL THEN
            CONTINUE WHEN v_heads >= v_head_limit;
            PERFORM 1 FROM {{ table }}_group AS g
            WHERE g.serial_group = v_groups[i]
            FOR UPDATE SKIP LOCKED;
            v_locked := FOUND;
            -- Not locked, yet there: another transaction holds it. (A group without a row yet
            -- gets one from {{ table }}_claim_job, which may wait for a concurrent first claim.)
            CONTINUE WHEN NOT v_locked AND EXISTS (
                SELECT 1 FROM {{ table }}_group AS g WHERE g.serial_group = v_groups[i]
            );
            IF v_locked AND v_modes[i] = 'normal' THEN
                -- The short way (see Steps), under the group lock: the head of a group without a
                -- PROCESSING job is what {{ table }}_claim_job's predecessor check asks; a head
                -- that needs anything more of it (WAITING, coalescing) goes the long way below.
                UPDATE {{ table }} AS j
                SET {{ claim_write() | indent(20) }}
                WHERE
                    j.id = v_ids[i]
                    AND j.state IN (1, 4, 8)
                    AND j.coalesce_threshold IS NULL
                    AND {{ in_queue('j') }}
                    AND {{ not_paused('j') }}
                    AND j.id = {{ group_head_id('v_groups[i]') }}
                    AND {{ no_job_running('v_groups[i]') }};
                IF FOUND THEN
                    v_claimed := v_claimed || v_ids[i];
                    v_heads := v_heads + 1;
                    CONTINUE;
                END IF;
            END IF;
        END IF;
        SELECT * INTO c
        FROM {{ table }}_claim_job(v_ids[i], p_queue, p_pid, p_waiting_ms, NULL, p_worker_id, v_now);
        IF c.o_outcome = 'claimed' THEN
            v_claimed := v_claimed || v_ids[i];
            v_heads := v_heads + (CASE WHEN v_groups[i] IS NULL THEN 0 ELSE 1 END);
        END IF;
    END LOOP;

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
        j.coalesce_threshold
    FROM {{ table }} AS j
    WHERE j.id = ANY(v_claimed) AND j.state = 2
    ORDER BY j.priority, j.id;
END;
$$;
