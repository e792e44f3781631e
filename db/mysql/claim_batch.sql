-- bgq {{ table }}_claim_batch, version 5 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL {{ table }}_claim_batch(p_queue, p_limit, p_pid, p_min_priority, p_max_priority,
--                                p_max_heads, p_waiting_ms, p_worker_id, p_now)
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
--   p_now           the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
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
--   {{ table }}_pending_head; only when those hold too few heads, from each group's best
--   priority (one pass over {{ table }}_pending_head), then its first id there. An ungrouped
--   job that is not UNIQUE is claimed by an UPDATE of the same columns {{ table }}_claim_job
--   writes (PROCESSING, attempts + 1, last_attempt_at, pid, worker_id; postponed_by,
--   error_message and metadata cleared). So is a NORMAL group head without a coalescing
--   threshold, not WAITING, once its group row is locked, when it is still the group's head,
--   in the queue and not paused, and no job of the group is PROCESSING: what
--   {{ table }}_claim_job would check and write (the short way). Any other group head, or a
--   UNIQUE job, goes through {{ table }}_claim_job, which re-checks it under the group lock
--   (predecessor, UNIQUE duplicate, coalescing); only 'claimed' jobs are returned.
-- Locks: ungrouped candidates FOR UPDATE SKIP LOCKED (never waits for them); group rows FOR
--   UPDATE SKIP LOCKED too: a head whose group row another transaction holds (a claim or a
--   finish in progress) is left out and the next candidate is tried, so batch claims neither
--   wait for nor deadlock on each other. Only a group that has no row yet (never claimed) gets
--   it from {{ table }}_claim_job, which waits at most 3 s for a concurrent first claim.
-- Fencing: every write is conditional on a claimable state.
-- Errors: 31002 / SQLSTATE BQ002 when p_limit is NULL or < 1 (nothing written).
-- Idempotent: no (each call claims more jobs); a claimed job is never claimed again.
-- MySQL 8: SKIP LOCKED (8.0.1+) in a derived table and JSON_TABLE (8.0.4+) are accepted by
--   MariaDB 10.11 and MySQL 8 alike. The fallback for the heads takes one pass over the
--   claimable grouped jobs (there is no loose index scan here): its cost grows with those rows.
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE {{ table }}_claim_batch(
    IN p_queue VARCHAR(255),
    IN p_limit INT,
    IN p_pid INT,
    IN p_min_priority INT,
    IN p_max_priority INT,
    IN p_max_heads INT,
    IN p_waiting_ms INT,
    IN p_worker_id BIGINT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_min INT DEFAULT COALESCE(p_min_priority, -2147483648);
    DECLARE v_max INT DEFAULT COALESCE(p_max_priority, 2147483647);
    DECLARE v_candidates LONGTEXT DEFAULT NULL;
    DECLARE v_claimed LONGTEXT DEFAULT '[]';
    DECLARE v_count INT DEFAULT 0;
    DECLARE v_head_limit INT DEFAULT LEAST(p_limit, COALESCE(p_max_heads, p_limit));
    DECLARE v_head_candidates INT DEFAULT 2 * LEAST(p_limit, COALESCE(p_max_heads, p_limit)) + 2;
    DECLARE v_heads INT DEFAULT 0;
    DECLARE v_scan INT DEFAULT 4 * (2 * LEAST(p_limit, COALESCE(p_max_heads, p_limit)) + 2) + 16;
    DECLARE v_head_json LONGTEXT DEFAULT NULL;
    DECLARE v_found INT DEFAULT 0;
    DECLARE v_scanned INT DEFAULT 0;
    DECLARE v_locked INT DEFAULT 0;
    DECLARE v_exists INT DEFAULT 0;
    DECLARE v_head BIGINT UNSIGNED;
    DECLARE v_running INT DEFAULT 0;
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_id BIGINT UNSIGNED;
    DECLARE v_outcome VARCHAR(16);
    DECLARE v_attempt INT;
    DECLARE v_state SMALLINT;
    DECLARE v_predecessor BIGINT UNSIGNED;
    DECLARE v_promoted BIGINT UNSIGNED;
    DECLARE v_group VARCHAR(255);
    DECLARE v_mode VARCHAR(16);
    -- Every candidate by primary key, ungrouped first, then groups in serial_group order: no
    -- statement scans (and waits for) rows of other transactions.
    DECLARE one_by_one CURSOR FOR
        SELECT
            c.id,
            c.serial_group,
            c.mode
        FROM
            JSON_TABLE(
                v_candidates, '$[*]' COLUMNS (
                    id BIGINT UNSIGNED PATH '$.id',
                    priority INT PATH '$.priority',
                    serial_group VARCHAR(255) PATH '$.serial_group',
                    mode VARCHAR(16) PATH '$.mode'
                )
            ) AS c
        ORDER BY c.priority, c.id;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;

    IF p_limit IS NULL OR p_limit < 1 THEN
        SIGNAL SQLSTATE 'BQ002'
            SET MYSQL_ERRNO = 31002, MESSAGE_TEXT = 'bgq: claim_batch limit must be at least 1';
    END IF;

    -- Up to 2 * n + 2 group heads (n: p_limit, or p_max_heads if smaller), in (priority, id)
    -- order. First the bounded scan: the first v_scan claimable grouped jobs in (priority, id)
    -- order ({{ table }}_grouped), of which those that are their group's head (its first
    -- unstarted job: one dive on {{ table }}_pending_head) in a group without a
    -- PROCESSING job. Every claimable head is among those jobs, in the same order, so when the
    -- scan finds enough heads, or reads fewer than v_scan jobs (it saw them all), its heads are
    -- the first ones.
    SELECT
        JSON_ARRAYAGG(
            JSON_OBJECT(
                'id', h.id, 'priority', h.priority, 'serial_group', h.serial_group, 'mode', h.mode
            )
        ) AS heads,
        COUNT(*) AS found
    INTO v_head_json, v_found
    FROM (
        SELECT
            s.id,
            s.priority,
            s.serial_group,
            s.mode
        FROM (
            SELECT
                id,
                priority,
                serial_group,
                mode,
                queue,
                created_at,
                last_attempt_at,
                postponed_by,
                processed_by_broker
            FROM {{ table }}
            WHERE grouped_priority BETWEEN v_min AND v_max
            ORDER BY grouped_priority, id
            LIMIT v_scan
        ) AS s
        WHERE
            {{ in_queue('s') }}
            AND {{ due('s') }}
            AND s.id = (
                SELECT x.id FROM {{ table }} AS x
                WHERE x.pending_group = s.serial_group
                ORDER BY x.priority, x.id
                LIMIT 1
            )
            AND {{ no_job_running('s.serial_group') }}
        ORDER BY s.priority, s.id
        LIMIT v_head_candidates
    ) AS h;

    IF v_found < v_head_candidates THEN
        SELECT COUNT(*) INTO v_scanned
        FROM (
            SELECT id FROM {{ table }}
            WHERE grouped_priority BETWEEN v_min AND v_max
            ORDER BY grouped_priority, id
            LIMIT v_scan
        ) AS n;
    END IF;

    -- Too few heads among v_scan jobs (the first ones belong to busy groups, or are not heads):
    -- every group's head, from one pass over the claimable grouped jobs.
    IF v_found < v_head_candidates AND v_scanned >= v_scan THEN
        SELECT
            JSON_ARRAYAGG(
                JSON_OBJECT(
                    'id', hh.id, 'priority', hh.priority, 'serial_group', hh.serial_group,
                    'mode', hh.mode
                )
            )
        INTO v_head_json
        FROM (
            SELECT
                j.id,
                j.priority,
                j.serial_group,
                j.mode
            FROM (
                -- Each group's best priority (one pass over {{ table }}_pending_head), then
                -- the group's first id at that priority.
                SELECT MIN(x.id) AS id
                FROM (
                    SELECT
                        pending_group AS best_group,
                        MIN(priority) AS best_priority
                    FROM {{ table }}
                    WHERE pending_group IS NOT NULL
                    GROUP BY pending_group
                ) AS m
                INNER JOIN {{ table }} AS x
                    ON x.pending_group = m.best_group AND x.priority = m.best_priority
                GROUP BY m.best_group
            ) AS heads
            INNER JOIN {{ table }} AS j ON j.id = heads.id
            WHERE
                j.state IN (1, 4, 6, 8)
                AND j.priority BETWEEN v_min AND v_max
                AND {{ in_queue('j') }}
                AND {{ due('j') }}
                AND {{ no_job_running('j.serial_group') }}
            ORDER BY j.priority, j.id
            LIMIT v_head_candidates
        ) AS hh;
    END IF;

    -- Up to p_limit ungrouped jobs (locked, skipping locked ones) and the heads, in (priority, id)
    -- order.
    SELECT
        JSON_ARRAYAGG(
            JSON_OBJECT(
                'id', c.id, 'priority', c.priority, 'serial_group', c.serial_group, 'mode', c.mode
            )
        )
    INTO v_candidates
    FROM (
        SELECT
            f.id,
            f.priority,
            f.serial_group,
            f.mode
        FROM (
            SELECT
                id,
                priority,
                serial_group,
                mode
            FROM {{ table }}
            WHERE
                ungrouped_priority BETWEEN v_min AND v_max
                AND {{ in_queue() }}
                AND {{ due() }}
            ORDER BY ungrouped_priority, id
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED  -- noqa: PRS
        ) AS f
        UNION ALL
        SELECT
            u.id,
            u.priority,
            u.serial_group,
            u.mode
        FROM
            JSON_TABLE(
                COALESCE(v_head_json, '[]'), '$[*]' COLUMNS (
                    id BIGINT UNSIGNED PATH '$.id',
                    priority INT PATH '$.priority',
                    serial_group VARCHAR(255) PATH '$.serial_group',
                    mode VARCHAR(16) PATH '$.mode'
                )
            ) AS u
    ) AS c;

    OPEN one_by_one;
    fetch_loop: LOOP
        FETCH one_by_one INTO v_id, v_group, v_mode;
        IF v_done = 1 OR v_count >= p_limit THEN
            LEAVE fetch_loop;
        END IF;
        IF v_group IS NOT NULL AND v_heads >= v_head_limit THEN
            ITERATE fetch_loop;
        END IF;
        IF v_group IS NOT NULL THEN
            -- The group row without waiting: one another transaction holds (a claim or a finish
            -- in progress) is there but not lockable, and its head is left out. (A group without
            -- a row yet gets one from {{ table }}_claim_job.) SELECT ... INTO is a plain read.
            SELECT COUNT(*) INTO v_locked
            FROM {{ table }}_group
            WHERE serial_group = v_group
            FOR UPDATE SKIP LOCKED;
            SELECT COUNT(*) INTO v_exists
            FROM {{ table }}_group
            WHERE serial_group = v_group;
            IF v_locked = 0 AND v_exists > 0 THEN
                ITERATE fetch_loop;
            END IF;
        END IF;
        SET v_outcome = NULL;
        IF v_group IS NULL AND v_mode <> 'unique' THEN
            -- The same columns as {{ table }}_claim_job writes; the row is locked already.
            UPDATE {{ table }}
            SET
                {{ claim_write() | indent(16) }}
            WHERE id = v_id AND state IN (1, 4, 6, 8);
            SET v_outcome = IF(ROW_COUNT() > 0, 'claimed', NULL);
        ELSE
            IF v_group IS NOT NULL AND v_locked > 0 AND v_mode = 'normal' THEN
                -- The short way (see Steps), under the group lock: the head of a group without a
                -- PROCESSING job is what {{ table }}_claim_job's predecessor check asks; a head
                -- that needs anything more of it (WAITING, coalescing) goes the long way below.
                SET v_head = NULL;
                SELECT id INTO v_head
                FROM {{ table }}
                WHERE pending_group = v_group
                ORDER BY priority, id
                LIMIT 1;
                SELECT COUNT(*) INTO v_running
                FROM {{ table }}
                WHERE running_group = v_group;
                IF v_head = v_id AND v_running = 0 THEN
                    UPDATE {{ table }}
                    SET
                        {{ claim_write() | indent(24) }}
                    WHERE
                        id = v_id
                        AND state IN (1, 4, 8)
                        AND coalesce_threshold IS NULL
                        AND {{ in_queue() }}
                        AND {{ not_paused() }};
                    SET v_outcome = IF(ROW_COUNT() > 0, 'claimed', NULL);
                END IF;
            END IF;
            IF v_outcome IS NULL THEN
                CALL {{ table }}_claim_job(
                    v_id, p_queue, p_pid, p_waiting_ms, NULL, p_worker_id, v_now,
                    v_outcome, v_attempt, v_state, v_predecessor, v_promoted
                );
            END IF;
        END IF;
        IF v_outcome = 'claimed' THEN
            SET v_claimed = JSON_ARRAY_APPEND(v_claimed, '$', v_id), v_count = v_count + 1;
            SET v_heads = v_heads + IF(v_group IS NULL, 0, 1);
        END IF;
    END LOOP;
    CLOSE one_by_one;

    SELECT
        j.id,
        j.number_of_attempts AS attempt,
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
    INNER JOIN
        JSON_TABLE(
            v_candidates, '$[*]' COLUMNS (
                id BIGINT UNSIGNED PATH '$.id',
                serial_group VARCHAR(255) PATH '$.serial_group',
                mode VARCHAR(16) PATH '$.mode'
            )
        ) AS c
        ON c.id = j.id
    WHERE
        j.state = 2
        AND JSON_CONTAINS(v_claimed, CAST(j.id AS CHAR))
    ORDER BY j.priority, j.id;
END
