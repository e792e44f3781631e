-- bgq background_job_claim_batch, version 7 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_claim_batch(p_queue, p_limit, p_pid, p_min_priority,
--                                         p_max_priority, p_max_heads, p_waiting_ms,
--                                         p_worker_id, p_now)
--   Claims only; a worker that finished a grouped job takes the group's next head with
--   background_job_hand_off instead.
--   p_queue         the base queue: jobs in it or in a sub-queue '<p_queue>_<sub>'.
--   p_limit         at most this many jobs are claimed (>= 1).
--   p_pid           the worker's process id (stored for people).
--   p_min_priority, p_max_priority: only jobs with a priority in this range (NULL: no bound).
--   p_max_heads     at most this many of the claimed jobs are group heads (NULL: p_limit). A
--                   worker that takes one group at a time leaves the other groups' heads to
--                   the other workers.
--   p_waiting_ms    passed to background_job_claim_job (a head that lost a race turns WAITING).
--   p_worker_id     stored in worker_id on every claimed job (NULL: none).
--   p_now           the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: one row per claimed job, ordered by priority then id; each is PROCESSING, the caller's
--   id, attempt     the job and its claim token for background_job_finish, background_job_finish_batch
--                   or background_job_hand_off.
--   callback_name, parameters_json, parameters, queue, priority, serial_group, identifier,
--   mode, coalesce_threshold: the job as stored.
-- Claimable: a due job (as in background_job_due_jobs without a broker: READY, TEMPORARILY_FAILED,
--   WAITING or BROKER_FAILED whose postponement has passed) of the queue and priority range that
--   is either ungrouped, or the head of its group (first in (priority, id) among the group's
--   unstarted jobs of every queue and state -1, 1, 4, 6, 8, due or not) while no job of the
--   group is PROCESSING. A group whose head is not due, or is in another queue or priority
--   range, is skipped as a whole: order inside a group never bends.
-- Steps: candidates are up to p_limit ungrouped jobs (taken FOR UPDATE SKIP LOCKED) and up to
--   2 * n + 2 group heads (n: p_limit, or p_max_heads if smaller), tried in (priority, id) order
--   until p_limit are claimed. The heads come from the first 4 * (2 * n + 2) + 16 claimable
--   grouped jobs in (priority, id) order (background_job_grouped), each checked by one dive on
--   background_job_pending_head; only when those hold fewer than n heads (the window was too
--   small: its first jobs belong to busy groups, or are not heads), from one index dive per group
--   (a cost that grows with the groups: every group's first jobs busy or not due). An
--   ungrouped job that is not UNIQUE is claimed by an UPDATE of the same columns
--   background_job_claim_job writes (PROCESSING, attempts + 1, last_attempt_at, pid, worker_id;
--   postponed_by, error_message and metadata cleared); a UNIQUE one by background_job_claim_job.
--   The candidates are claimed in rounds, in (priority, id) order: each round takes the next
--   ones, as many as are still to claim (and heads up to n), and claims them together, the heads
--   through background_job_claim_heads (each group's head re-derived and checked under its group
--   lock); a candidate that could not be claimed makes room for the next round. Only claimed
--   jobs are returned.
-- Locks: ungrouped candidates FOR UPDATE SKIP LOCKED (never waits for them); group rows FOR
--   UPDATE SKIP LOCKED too (background_job_claim_heads): a head whose group row another
--   transaction holds (a claim or a finish in progress) is left out and the next candidate is
--   tried, so batch claims neither wait for nor deadlock on each other. Only a group that has no
--   row yet (never claimed) gets one from background_job_claim_heads, which waits at most
--   3 s for a concurrent first claim of the same group.
-- Fencing: every write is conditional on a claimable state.
-- Errors: SQLSTATE BQ002 when p_limit is NULL or < 1 (nothing written).
-- Idempotent: no (each call claims more jobs); a claimed job is never claimed again.
-- Group row: every claim of a group's job writes the group's row (the MySQL twin's rule, for
--   Galera, where a row lock holds on one node only); here the row is locked or upserted as
--   before: version 7 changes nothing in this file but the version.
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION background_job_claim_batch(
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
    v_count INTEGER;
    v_pos INTEGER := 1;
    v_take BIGINT[];
    v_take_groups VARCHAR[];
    v_round_heads INTEGER;
    v_got BIGINT[];
    c RECORD;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'bgq: claim_batch limit must be at least 1' USING ERRCODE = 'BQ002';
    END IF;

    -- Up to 2 * n + 2 group heads (n: p_limit, or p_max_heads if smaller; a head whose group
    -- another claim holds is skipped below, and the next one is tried), in (priority, id) order.
    -- First the bounded scan: the first v_scan claimable grouped jobs in (priority, id) order
    -- (background_job_grouped), of which those that are their group's head (its first unstarted
    -- job: one dive on background_job_pending_head) in a group without a PROCESSING job.
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
            FROM background_job AS g
            WHERE
                g.serial_group IS NOT NULL
                AND g.state IN (1, 4, 6, 8)
                AND g.priority BETWEEN v_min AND v_max
            ORDER BY g.priority, g.id
            LIMIT v_scan
        ) AS s
        WHERE
            (s.queue = p_queue OR LEFT(s.queue, LENGTH(p_queue) + 1) = p_queue || '_')
            AND ((s.processed_by_broker = 1 OR GREATEST(s.created_at, COALESCE(s.last_attempt_at, s.created_at))
+ CEIL(COALESCE(s.postponed_by, 0) / 1000.0) * INTERVAL '1 second' <= v_now) AND NOT EXISTS (
    SELECT 1 FROM background_job_paused AS pz
    WHERE
        (
            pz.kind = 'queue'
            AND (s.queue = pz.name OR LEFT(s.queue, LENGTH(pz.name) + 1) = pz.name || '_')
        )
        OR (pz.kind = 'group' AND s.serial_group = pz.name)
))
            AND s.id = (
    SELECT x.id FROM background_job AS x
    WHERE x.serial_group = s.serial_group AND x.state IN (-1, 1, 4, 6, 8)
    ORDER BY x.priority, x.id
    LIMIT 1
)
            AND (SELECT 1 FROM background_job AS r WHERE r.serial_group = s.serial_group AND r.state = 2 LIMIT 1) IS NULL
        ORDER BY s.priority, s.id
        LIMIT v_head_candidates
    ) AS h;

    -- Fewer than n heads among v_scan jobs (the first ones belong to busy groups, or are not
    -- heads; n heads are enough, the spare ones only replace heads whose group is locked):
    -- every group's head, one index dive per group on background_job_pending_head.
    IF COALESCE(ARRAY_LENGTH(v_hids, 1), 0) < v_head_limit
        AND (
            SELECT COUNT(*) FROM (
                SELECT 1 FROM background_job AS g
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
                        FROM background_job AS g
                        WHERE
                            g.serial_group IS NOT NULL
                            AND g.state IN (-1, 1, 4, 6, 8)
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
                        FROM background_job AS g
                        WHERE
                            g.serial_group > h.serial_group
                            AND g.state IN (-1, 1, 4, 6, 8)
                        ORDER BY g.serial_group, g.priority, g.id
                        LIMIT 1
                    ) AS n
                )

                SELECT * FROM heads
            ) AS h
            WHERE
                h.state IN (1, 4, 6, 8)
                AND h.priority BETWEEN v_min AND v_max
                AND (h.queue = p_queue OR LEFT(h.queue, LENGTH(p_queue) + 1) = p_queue || '_')
                AND ((h.processed_by_broker = 1 OR GREATEST(h.created_at, COALESCE(h.last_attempt_at, h.created_at))
                + CEIL(COALESCE(h.postponed_by, 0) / 1000.0) * INTERVAL '1 second' <= v_now) AND NOT EXISTS (
                    SELECT 1 FROM background_job_paused AS pz
                    WHERE
                        (
                            pz.kind = 'queue'
                            AND (h.queue = pz.name OR LEFT(h.queue, LENGTH(pz.name) + 1) = pz.name || '_')
                        )
                        OR (pz.kind = 'group' AND h.serial_group = pz.name)
                ))
                AND (SELECT 1 FROM background_job AS x WHERE x.serial_group = h.serial_group AND x.state = 2 LIMIT 1) IS NULL
            ORDER BY h.priority, h.id
            LIMIT v_head_candidates) AS hh;
    END IF;

    -- Up to p_limit ungrouped jobs (locked, skipping locked ones) and the heads, in (priority, id)
    -- order.
    SELECT
        ARRAY_AGG(c.id ORDER BY c.priority, c.id),
        ARRAY_AGG(c.serial_group ORDER BY c.priority, c.id),
        ARRAY_AGG(c.mode ORDER BY c.priority, c.id)
    INTO v_ids, v_groups, v_modes
    FROM (
        SELECT f.id, f.priority, NULL::VARCHAR AS serial_group, f.mode
        FROM (
            SELECT j.id, j.priority, j.mode
            FROM background_job AS j
            WHERE
                j.serial_group IS NULL
                AND j.state IN (1, 4, 6, 8)
                AND j.priority BETWEEN v_min AND v_max
                AND (j.queue = p_queue OR LEFT(j.queue, LENGTH(p_queue) + 1) = p_queue || '_')
                AND ((j.processed_by_broker = 1 OR GREATEST(j.created_at, COALESCE(j.last_attempt_at, j.created_at))
+ CEIL(COALESCE(j.postponed_by, 0) / 1000.0) * INTERVAL '1 second' <= v_now) AND NOT EXISTS (
    SELECT 1 FROM background_job_paused AS pz
    WHERE
        (
            pz.kind = 'queue'
            AND (j.queue = pz.name OR LEFT(j.queue, LENGTH(pz.name) + 1) = pz.name || '_')
        )
        OR (pz.kind = 'group' AND j.serial_group = pz.name)
))
            ORDER BY j.priority, j.id
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ) AS f
        UNION ALL
        SELECT u.id, u.priority, u.serial_group, u.mode
        FROM UNNEST(v_hids, v_hpriorities, v_hgroups, v_hmodes) AS u (id, priority, serial_group, mode)
    ) AS c;

    -- In rounds, in (priority, id) order: the next candidates, up to what is still to claim
    -- (and heads up to v_head_limit), claimed together: the ungrouped ones by one UPDATE (the
    -- columns background_job_claim_job writes; their rows are locked already) or, if UNIQUE, by
    -- background_job_claim_job; the heads' groups by background_job_claim_heads. A candidate that
    -- could not be claimed (its group row held elsewhere, raced) makes room for the next ones.
    v_count := COALESCE(ARRAY_LENGTH(v_ids, 1), 0);
    WHILE v_pos <= v_count AND COALESCE(ARRAY_LENGTH(v_claimed, 1), 0) < p_limit LOOP
        v_take := '{}';
        v_take_groups := '{}';
        v_round_heads := 0;
        WHILE v_pos <= v_count
            AND CARDINALITY(v_take) + CARDINALITY(v_take_groups)
            < p_limit - COALESCE(ARRAY_LENGTH(v_claimed, 1), 0) LOOP
            IF v_groups[v_pos] IS NULL THEN
                v_take := v_take || v_ids[v_pos];
            ELSIF v_heads + v_round_heads < v_head_limit THEN
                v_take_groups := v_take_groups || v_groups[v_pos];
                v_round_heads := v_round_heads + 1;
            END IF;
            v_pos := v_pos + 1;
        END LOOP;
        EXIT WHEN CARDINALITY(v_take) + CARDINALITY(v_take_groups) = 0;
        WITH taken AS (
            UPDATE background_job AS j
            SET state = 2,
                number_of_attempts = j.number_of_attempts + 1,
                last_attempt_at = v_now,
                pid = p_pid,
                worker_id = p_worker_id,
                postponed_by = NULL,
                error_message = NULL,
                metadata = NULL,
                updated_at = v_now
            WHERE j.id = ANY(v_take) AND j.mode <> 'unique' AND (j.state IN (1, 4, 6, 8)) IS TRUE
            RETURNING j.id
        )

        SELECT v_claimed || ARRAY(SELECT t.id FROM taken AS t) INTO v_claimed;
        FOR c IN
            SELECT j.id FROM background_job AS j WHERE j.id = ANY(v_take) AND j.mode = 'unique'
        LOOP
            IF (background_job_claim_job(c.id, p_queue, p_pid, p_waiting_ms, NULL, p_worker_id, v_now)).o_outcome
                = 'claimed' THEN
                v_claimed := v_claimed || c.id;
            END IF;
        END LOOP;
        IF CARDINALITY(v_take_groups) > 0 THEN
            v_got := background_job_claim_heads(
                v_take_groups, '{}', p_queue, p_pid, p_min_priority, p_max_priority,
                p_waiting_ms, p_worker_id, v_now
            );
            v_claimed := v_claimed || v_got;
            v_heads := v_heads + CARDINALITY(v_got);
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
    FROM background_job AS j
    WHERE j.id = ANY(v_claimed) AND (j.state = 2) IS TRUE  -- by primary key, not by state
    ORDER BY j.priority, j.id;
END;
$$;
