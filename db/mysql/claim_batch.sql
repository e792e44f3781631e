-- bgq {{ table }}_claim_batch, version 2 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL {{ table }}_claim_batch(p_queue, p_limit, p_pid, p_min_priority, p_max_priority,
--                                p_group, p_waiting_ms, p_now)
--   p_queue         the base queue: jobs in it or in a sub-queue '<p_queue>_<sub>'.
--   p_limit         at most this many jobs are claimed (>= 1).
--   p_pid           the worker's process id (stored for people).
--   p_min_priority, p_max_priority: only jobs with a priority in this range (NULL: no bound).
--   p_group         NULL: ungrouped jobs and the heads of idle groups; a group name: only that
--                   group's head (the worker that just finished the group's job hands it on).
--   p_waiting_ms    passed to {{ table }}_claim_job (a head that lost a race turns WAITING).
--   p_now           the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: one row per claimed job, ordered by priority then id; each is PROCESSING, the caller's
--   id, attempt     the job and its claim token for {{ table }}_finish / {{ table }}_finish_batch.
--   callback_name, parameters_json, parameters, queue, priority, serial_group, identifier,
--   mode, coalesce_threshold: the job as stored.
-- Claimable: a due job (as in {{ table }}_due_jobs without a broker: READY, TEMPORARILY_FAILED,
--   WAITING or BROKER_FAILED whose postponement has passed) of the queue and priority range that
--   is either ungrouped, or the head of its group (first in (priority, id) among the group's
--   unstarted jobs of every queue and state -1, 1, 4, 6, 8, due or not) while no job of the
--   group is PROCESSING. A group whose head is not due, or is in another queue or priority
--   range, is skipped as a whole: order inside a group never bends.
-- Steps: the first p_limit of (ungrouped candidates on {{ table }}_ungrouped, taken FOR UPDATE
--   SKIP LOCKED) and (group heads: a recursive walk that takes one index dive per group on
--   {{ table }}_pending_head) in (priority, id) order. Ungrouped jobs that are not UNIQUE are
--   claimed by one UPDATE (the same columns as {{ table }}_claim_job writes: PROCESSING,
--   attempts + 1, last_attempt_at, pid; postponed_by, error_message and metadata cleared).
--   Group heads and UNIQUE jobs go through {{ table }}_claim_job one by one, in serial_group
--   order, which re-checks them under the group lock (predecessor, UNIQUE duplicate,
--   coalescing); only its 'claimed' jobs are returned.
-- Locks: ungrouped candidates FOR UPDATE SKIP LOCKED (never waits for them); group rows one at
--   a time in serial_group order (so two batch claims cannot deadlock on each other), each
--   waiting at most 3 s ({{ table }}_claim_job; 'locked' just leaves the head out).
-- Fencing: every write is conditional on a claimable state.
-- Errors: 31002 / SQLSTATE BQ002 when p_limit is NULL or < 1 (nothing written).
-- Idempotent: no (each call claims more jobs); a claimed job is never claimed again.
-- MySQL 8: the recursive walk's scalar MIN() subquery and SKIP LOCKED in a derived table are
--   accepted by MariaDB 10.11; MySQL 8.0.x accepts both too (8.0.1+ for SKIP LOCKED).
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE {{ table }}_claim_batch(
    IN p_queue VARCHAR(255),
    IN p_limit INT,
    IN p_pid INT,
    IN p_min_priority INT,
    IN p_max_priority INT,
    IN p_group VARCHAR(255),
    IN p_waiting_ms INT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_min INT DEFAULT COALESCE(p_min_priority, -2147483648);
    DECLARE v_max INT DEFAULT COALESCE(p_max_priority, 2147483647);
    DECLARE v_candidates LONGTEXT DEFAULT NULL;
    DECLARE v_claimed LONGTEXT DEFAULT '[]';
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_id BIGINT UNSIGNED;
    DECLARE v_outcome VARCHAR(16);
    DECLARE v_attempt INT;
    DECLARE v_state SMALLINT;
    DECLARE v_predecessor BIGINT UNSIGNED;
    DECLARE v_promoted BIGINT UNSIGNED;
    DECLARE one_by_one CURSOR FOR
        SELECT c.id
        FROM
            JSON_TABLE(
                v_candidates, '$[*]' COLUMNS (  -- noqa: RF03
                    id BIGINT UNSIGNED PATH '$.id',
                    serial_group VARCHAR(255) PATH '$.serial_group',
                    mode VARCHAR(16) PATH '$.mode'
                )
            ) AS c
        WHERE c.serial_group IS NOT NULL OR c.mode = 'unique'
        ORDER BY c.serial_group, c.id;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;

    IF p_limit IS NULL OR p_limit < 1 THEN
        SIGNAL SQLSTATE 'BQ002'
            SET MYSQL_ERRNO = 31002, MESSAGE_TEXT = 'bgq: claim_batch limit must be at least 1';
    END IF;

    SELECT
        JSON_ARRAYAGG(
            JSON_OBJECT('id', c.id, 'serial_group', c.serial_group, 'mode', c.mode)
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
                p_group IS NULL
                AND ungrouped_priority BETWEEN v_min AND v_max
                AND (queue = p_queue OR LEFT(queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
                AND (
                    processed_by_broker = 1
                    OR GREATEST(created_at, COALESCE(last_attempt_at, created_at))
                    + INTERVAL CEIL(COALESCE(postponed_by, 0) / 1000) SECOND <= v_now
                )
            ORDER BY ungrouped_priority, id
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED  -- noqa: PRS
        ) AS f
        UNION ALL
        SELECT
            j.id,
            j.priority,
            j.serial_group,
            j.mode
        FROM (
            WITH RECURSIVE walk (serial_group) AS (
                SELECT COALESCE(p_group, (SELECT MIN(pending_group) FROM {{ table }}))
                UNION ALL
                SELECT (
                    SELECT MIN(x.pending_group) FROM {{ table }} AS x
                    WHERE x.pending_group > walk.serial_group
                )
                FROM walk
                WHERE walk.serial_group IS NOT NULL AND p_group IS NULL
            )

            SELECT (
                SELECT h.id FROM {{ table }} AS h
                WHERE h.pending_group = walk.serial_group
                ORDER BY h.priority, h.id
                LIMIT 1
            ) AS id
            FROM walk
            WHERE walk.serial_group IS NOT NULL
        ) AS heads
        INNER JOIN {{ table }} AS j ON j.id = heads.id
        WHERE
            j.state IN (1, 4, 6, 8)
            AND j.priority BETWEEN v_min AND v_max
            AND (j.queue = p_queue OR LEFT(j.queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
            AND (
                j.processed_by_broker = 1
                OR GREATEST(j.created_at, COALESCE(j.last_attempt_at, j.created_at))
                + INTERVAL CEIL(COALESCE(j.postponed_by, 0) / 1000) SECOND <= v_now
            )
            AND NOT EXISTS (
                SELECT 1 FROM {{ table }} AS r
                WHERE r.running_group = j.serial_group
            )
        ORDER BY priority, id  -- noqa: RF03
        LIMIT p_limit  -- noqa: RF03
    ) AS c;

    UPDATE {{ table }} AS j
        INNER JOIN  -- noqa: LT02
            JSON_TABLE(
                v_candidates, '$[*]' COLUMNS (
                    id BIGINT UNSIGNED PATH '$.id',
                    serial_group VARCHAR(255) PATH '$.serial_group',
                    mode VARCHAR(16) PATH '$.mode'
                )
            ) AS c
            ON c.id = j.id
    SET
        j.state = 2,
        j.number_of_attempts = j.number_of_attempts + 1,
        j.last_attempt_at = v_now,
        j.pid = p_pid,
        j.postponed_by = NULL,
        j.error_message = NULL,
        j.metadata = NULL,
        j.updated_at = v_now
    WHERE c.serial_group IS NULL AND c.mode <> 'unique' AND j.state IN (1, 4, 6, 8);

    OPEN one_by_one;
    fetch_loop: LOOP
        FETCH one_by_one INTO v_id;
        IF v_done = 1 THEN
            LEAVE fetch_loop;
        END IF;
        CALL {{ table }}_claim_job(
            v_id, p_queue, p_pid, p_waiting_ms, NULL, v_now,
            v_outcome, v_attempt, v_state, v_predecessor, v_promoted
        );
        SET v_done = 0;
        IF v_outcome = 'claimed' THEN
            SET v_claimed = JSON_ARRAY_APPEND(v_claimed, '$', v_id);
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
        AND (
            (c.serial_group IS NULL AND c.mode <> 'unique')
            OR JSON_CONTAINS(v_claimed, CAST(j.id AS CHAR))
        )
    ORDER BY j.priority, j.id;
END
