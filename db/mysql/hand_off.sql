-- bgq {{ table }}_hand_off, version 2 (MySQL 8 / MariaDB 10.11)
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
--   The common case takes a shorter way with the same effects: one FINISHED result without a
--   copy, of a NORMAL or UNIQUE job of p_group, in a group with no WAITING job and no waiting
--   head recorded (nothing to wake), whose next head is a NORMAL job without a coalescing
--   threshold, not WAITING: the group row is locked, the result written (fenced), and the head
--   claimed by one UPDATE under that lock (being the head in a group without a PROCESSING job
--   is what {{ table }}_claim_job's predecessor check asks). Anything else goes the long way.
-- Locks: those of {{ table }}_finish_results, then the group row FOR UPDATE SKIP LOCKED (held
--   already when p_results finished a job of the group): a group row another transaction holds
--   is not waited for, and nothing is claimed. Only a group that has no row yet gets it from
--   {{ table }}_claim_job, which waits at most 3 s for a concurrent first claim.
-- Fencing: each result is written only WHERE state = 2 AND number_of_attempts = attempt; the
--   claim is conditional on a claimable state.
-- Errors: 31002 / SQLSTATE BQ002 (nothing written) when p_group is NULL; those of
--   {{ table }}_finish_results.
-- Idempotent: no (a second call may claim the next head); a claimed job is never claimed again.
-- MySQL 8: SKIP LOCKED (8.0.1+), JSON_TABLE (8.0.4+) and JSON_VALUE (8.0.21+) are accepted by
--   MariaDB 10.11 and MySQL 8 alike.
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
    DECLARE v_id BIGINT UNSIGNED DEFAULT NULL;
    DECLARE v_result_attempt INT;
    DECLARE v_result_state INT;
    DECLARE v_error LONGTEXT;
    DECLARE v_postponed_by INT;
    DECLARE v_execution_time INT;
    DECLARE v_memory LONGTEXT;
    DECLARE v_clone_delay INT;
    DECLARE v_job_group VARCHAR(255) DEFAULT NULL;
    DECLARE v_job_mode VARCHAR(16) DEFAULT NULL;
    DECLARE v_waiting INT DEFAULT 0;
    DECLARE v_recorded INT DEFAULT 0;
    DECLARE v_head_state SMALLINT;
    DECLARE v_head_mode VARCHAR(16);
    DECLARE v_head_threshold BIGINT;
    DECLARE v_short INT DEFAULT 0;
    DECLARE v_claimable INT DEFAULT 0;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;

    IF p_group IS NULL THEN
        SIGNAL SQLSTATE 'BQ002'
            SET MYSQL_ERRNO = 31002, MESSAGE_TEXT = 'bgq: hand_off needs a group';
    END IF;

    -- The short way (see Steps): one FINISHED result without a copy, of a job of p_group. Read
    -- with JSON_VALUE (cheaper than a JSON_TABLE for one object; a JSON null reads as NULL).
    IF
        p_results IS NOT NULL
        AND JSON_TYPE(p_results) = 'ARRAY'
        AND JSON_LENGTH(p_results) = 1
        AND JSON_VALUE(p_results, '$[0].state') = 3
        AND JSON_VALUE(p_results, '$[0].clone_delay_ms') IS NULL
    THEN
        -- The result, and the job's serial_group and mode (they never change: a plain read).
        -- Nothing to wake (as {{ table }}_group_wake decides): no WAITING job, no waiting head
        -- recorded. (JSON_VALUE's text is VARCHAR(512) on MySQL 8: the error is unquoted.)
        SELECT
            j.id,
            JSON_VALUE(p_results, '$[0].attempt') AS attempt,
            IF(
                JSON_TYPE(JSON_EXTRACT(p_results, '$[0].error')) = 'STRING',
                JSON_UNQUOTE(JSON_EXTRACT(p_results, '$[0].error')),
                NULL
            ) AS error,
            JSON_VALUE(p_results, '$[0].postponed_by') AS postponed_by,
            JSON_VALUE(p_results, '$[0].execution_time') AS execution_time,
            JSON_EXTRACT(p_results, '$[0].memory') AS memory,
            j.serial_group,
            j.mode,
            EXISTS(
                SELECT 1 FROM {{ table }} AS w
                WHERE w.serial_group = p_group AND w.state = 6
            ) AS waiting,
            EXISTS(
                SELECT 1 FROM {{ table }}_group AS g
                WHERE g.serial_group = p_group AND g.waiting_head_id IS NOT NULL
            ) AS recorded
        INTO
        v_id, v_result_attempt, v_error, v_postponed_by, v_execution_time, v_memory,
        v_job_group, v_job_mode, v_waiting, v_recorded
        FROM {{ table }} AS j
        WHERE j.id = JSON_VALUE(p_results, '$[0].id');
    END IF;
    IF v_job_group = p_group AND v_job_mode IN ('normal', 'unique') AND v_waiting = 0 AND v_recorded = 0 THEN
        SET v_short = 1;
        INSERT INTO {{ table }}_group (serial_group, updated_at) VALUES (p_group, v_now)
        ON DUPLICATE KEY UPDATE updated_at = v_now;
        -- As {{ table }}_finish_results writes a FINISHED result (a JSON null memory: NULL).
        UPDATE {{ table }}
        SET
            execution_time = v_execution_time,
            memory = NULLIF(v_memory, 'null'),
            finished_at = v_now,
            error_message = v_error,
            postponed_by = v_postponed_by,
            updated_at = v_now,
            state = 3
        WHERE id = v_id AND state = 2 AND number_of_attempts = v_result_attempt;
        SET v_written = IF(ROW_COUNT() > 0, JSON_ARRAY(JSON_OBJECT('id', v_id)), JSON_ARRAY());
    END IF;

    IF p_results IS NOT NULL AND v_short = 0 THEN
        CALL {{ table }}_finish_results(p_results, v_now, v_written);
    END IF;

    -- The group's head (one index dive), kept if it is claimable here; its state, mode and
    -- threshold for the short way's claim.
    SELECT
        h.id,
        h.state,
        h.mode,
        h.coalesce_threshold,
        h.state IN (1, 4, 6, 8)
        AND h.priority BETWEEN v_min AND v_max
        AND {{ in_queue('h') }}
        AND {{ due('h') | indent(8) }}
        AND {{ no_job_running('p_group', 'x') }}
    INTO v_head, v_head_state, v_head_mode, v_head_threshold, v_claimable
    FROM {{ table }} AS h
    WHERE h.pending_group = p_group
    ORDER BY h.priority, h.id
    LIMIT 1;
    IF NOT v_claimable THEN
        SET v_head = NULL;
    END IF;

    IF v_short = 1 AND v_head IS NOT NULL THEN
        -- The short way's claim, when the head needs nothing of {{ table }}_claim_job's.
        IF v_head_state IN (1, 4, 8) AND v_head_mode = 'normal' AND v_head_threshold IS NULL THEN
            -- The same columns as {{ table }}_claim_job writes; the group row is locked already.
            UPDATE {{ table }}
            SET
                {{ claim_write() | indent(16) }}
            WHERE id = v_head AND state IN (1, 4, 8);
            IF ROW_COUNT() > 0 THEN
                SET v_claimed = v_head;
            END IF;
            SET v_head = NULL;
        END IF;
    END IF;

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

    -- One row per result, then the claimed job: one pass, no UNION (MariaDB would copy the
    -- claimed job's BLOB and JSON columns into a temporary table). The columns in the
    -- contract's order, the computed id first.
    SELECT  -- noqa: ST06
        IF(r.claimed = 1, j.id, r.id) AS id,
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
        IF(r.claimed = 1, NULL, IF(w.id IS NULL, 0, 1)) AS finished
    FROM
        JSON_TABLE(
            JSON_ARRAY_APPEND(COALESCE(p_results, '[]'), '$', JSON_OBJECT('claimed', 1)),
            '$[*]' COLUMNS (
                id BIGINT UNSIGNED PATH '$.id',
                claimed INT PATH '$.claimed'
            )
        ) AS r
    LEFT JOIN JSON_TABLE(v_written, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$.id')) AS w
        ON r.claimed IS NULL AND w.id = r.id
    LEFT JOIN {{ table }} AS j
        ON r.claimed = 1 AND j.id = v_claimed AND j.state = 2
    WHERE r.claimed IS NULL OR j.id IS NOT NULL;
END
