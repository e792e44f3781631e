-- bgq {{ table }}_hand_off, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL {{ table }}_hand_off(p_results, p_group, p_queue, p_pid, p_min_priority, p_max_priority,
--                             p_waiting_ms, p_worker_id, p_now)
--   A worker finishes a grouped job and claims the group's next head in one call and one
--   transaction: the group never stands idle between them, and no other worker takes it.
--   p_results       NULL, or the results to write first: the JSON of {{ table }}_finish_batch,
--                   written by {{ table }}_finish_results (its errors included).
--   p_group         the serial group whose head is claimed.
--   p_queue         the base queue: the head must be in it or in a sub-queue '<p_queue>_<sub>'.
--   p_pid           the worker's process id (stored for people).
--   p_min_priority, p_max_priority: the head's priority must lie in this range (NULL: no bound).
--   p_waiting_ms    passed to {{ table }}_claim_job (a head that lost a race turns WAITING).
--   p_worker_id     stored in worker_id on the claimed job (NULL: none).
--   p_now           the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: first one row per p_results object, then at most one claimed job
--   id, attempt     the job and, for the claimed job, its claim token for {{ table }}_finish,
--                   {{ table }}_finish_batch or the next {{ table }}_hand_off.
--   callback_name, parameters_json, parameters, queue, priority, serial_group, identifier,
--   mode, coalesce_threshold: the claimed job as stored (NULL on the result rows).
--   finished        on a result row: 1 if written, 0 if fenced out; NULL on the claimed row.
-- Claimable: the group's head (first in (priority, id) among the group's unstarted jobs of
--   every queue and state -1, 1, 4, 6, 8, due or not; one index dive on
--   {{ table }}_pending_head) when it is READY, TEMPORARILY_FAILED, WAITING or BROKER_FAILED, due
--   (as in {{ table }}_due_jobs without a broker), of the queue and priority range, while no
--   job of the group is PROCESSING. Nothing else: order inside a group never bends.
-- Steps: {{ table }}_finish_results writes p_results (the group row locked, the jobs written,
--   copies inserted, the group woken); then the head is claimed through {{ table }}_claim_job,
--   which re-checks it under the group lock (predecessor, UNIQUE duplicate, coalescing) and
--   writes the claim (PROCESSING, attempts + 1, last_attempt_at, pid, worker_id; postponed_by,
--   error_message and metadata cleared). Only a 'claimed' head is returned.
-- Locks: those of {{ table }}_finish_results, then the group row FOR UPDATE SKIP LOCKED (held
--   already when p_results finished a job of the group): a group row another transaction holds
--   is not waited for, and nothing is claimed. Only a group that has no row yet gets it from
--   {{ table }}_claim_job, which waits at most 3 s for a concurrent first claim.
-- Fencing: each result is written only WHERE state = 2 AND number_of_attempts = attempt; the
--   claim is conditional on a claimable state.
-- Errors: 31002 / SQLSTATE BQ002 (nothing written) when p_group is NULL; those of
--   {{ table }}_finish_results.
-- Idempotent: no (a second call may claim the next head); a claimed job is never claimed again.
-- MySQL 8: SKIP LOCKED (8.0.1+) and JSON_TABLE (8.0.4+) are accepted by MariaDB 10.11 and
--   MySQL 8 alike.
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE {{ table }}_hand_off(
    IN p_results LONGTEXT,
    IN p_group VARCHAR(255),
    IN p_queue VARCHAR(255),
    IN p_pid INT,
    IN p_min_priority INT,
    IN p_max_priority INT,
    IN p_waiting_ms INT,
    IN p_worker_id BIGINT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_min INT DEFAULT COALESCE(p_min_priority, -2147483648);
    DECLARE v_max INT DEFAULT COALESCE(p_max_priority, 2147483647);
    DECLARE v_written LONGTEXT DEFAULT '[]';
    DECLARE v_head BIGINT UNSIGNED DEFAULT NULL;
    DECLARE v_claimed BIGINT UNSIGNED DEFAULT NULL;
    DECLARE v_locked INT DEFAULT 0;
    DECLARE v_exists INT DEFAULT 0;
    DECLARE v_outcome VARCHAR(16);
    DECLARE v_attempt INT;
    DECLARE v_state SMALLINT;
    DECLARE v_predecessor BIGINT UNSIGNED;
    DECLARE v_promoted BIGINT UNSIGNED;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;

    IF p_group IS NULL THEN
        SIGNAL SQLSTATE 'BQ002'
            SET MYSQL_ERRNO = 31002, MESSAGE_TEXT = 'bgq: hand_off needs a group';
    END IF;

    IF p_results IS NOT NULL THEN
        CALL {{ table }}_finish_results(p_results, v_now, v_written);
    END IF;

    -- The group's head, if it is claimable here (one index dive).
    SELECT h.id INTO v_head
    FROM (
        SELECT
            id,
            priority,
            state,
            queue,
            serial_group,
            created_at,
            last_attempt_at,
            postponed_by,
            processed_by_broker
        FROM {{ table }}
        WHERE pending_group = p_group
        ORDER BY priority, id
        LIMIT 1
    ) AS h
    WHERE
        h.state IN (1, 4, 6, 8)
        AND h.priority BETWEEN v_min AND v_max
        AND {{ in_queue('h') }}
        AND {{ due('h') }}
        AND NOT EXISTS (
            SELECT 1 FROM {{ table }} AS x
            WHERE x.running_group = p_group
        );

    IF v_head IS NOT NULL THEN
        -- The group row without waiting: this transaction holds it already when p_results
        -- finished a job of the group; one another transaction holds is there but not lockable,
        -- and the head is left alone. SELECT ... INTO is a plain read.
        SELECT COUNT(*) INTO v_locked
        FROM {{ table }}_group
        WHERE serial_group = p_group
        FOR UPDATE SKIP LOCKED;
        SELECT COUNT(*) INTO v_exists
        FROM {{ table }}_group
        WHERE serial_group = p_group;
        IF v_locked > 0 OR v_exists = 0 THEN
            CALL {{ table }}_claim_job(
                v_head, p_queue, p_pid, p_waiting_ms, NULL, p_worker_id, v_now,
                v_outcome, v_attempt, v_state, v_predecessor, v_promoted
            );
            IF v_outcome = 'claimed' THEN
                SET v_claimed = v_head;
            END IF;
        END IF;
    END IF;

    SELECT
        r.id,
        NULL AS attempt,
        NULL AS callback_name,
        NULL AS parameters_json,
        NULL AS parameters,
        NULL AS queue,
        NULL AS priority,
        NULL AS serial_group,
        NULL AS identifier,
        NULL AS mode,
        NULL AS coalesce_threshold,
        IF(w.id IS NULL, 0, 1) AS finished
    FROM JSON_TABLE(COALESCE(p_results, '[]'), '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$.id')) AS r
    LEFT JOIN JSON_TABLE(v_written, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$.id')) AS w
        ON w.id = r.id
    UNION ALL
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
        j.coalesce_threshold,
        NULL AS finished
    FROM {{ table }} AS j
    WHERE j.id = v_claimed AND j.state = 2;
END
