-- bgq background_job_finish_results, version 5 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_finish_results(p_results, p_now, @written)
--   The one place where results are written: background_job_finish (one job), background_job_finish_batch
--   (many) and background_job_hand_off (many, then the group's next head) are thin wrappers over it.
--   p_results  JSON text: an array of objects, each id at most once:
--              {"id", "attempt", "state", "error", "postponed_by", "execution_time", "memory",
--               "clone_delay_ms"}
--              id, attempt: the job and its claim token (the `attempt` of the claim).
--              state: 3 FINISHED, 4 TEMPORARILY_FAILED, 5 PERMANENTLY_FAILED, 7 REDUNDANT, or
--                1 READY, which gives back a job that was claimed but never started
--                (attempts - 1, pid and metadata cleared; last_attempt_at, execution_time and
--                memory stay). A job whose attempt background_job_cancel asked to stop while it
--                was held is not given back: it is written REDUNDANT (finished_at set, its
--                'Cancelled: <reason>' kept, attempts and pid as claimed) and its group woken.
--              error: error_message to store (NULL on success).
--              postponed_by: ms before the job may run again (a temporary failure's backoff).
--              execution_time: ms the callback took; memory: a JSON object (NULL when the
--                callback did not succeed).
--              clone_delay_ms: NULL, or: insert a fresh copy of the job (same callback,
--                parameters, queue, priority, group, identifier, mode, coalesce_threshold,
--                processed_by_broker; READY, attempts 0, postponed_by this many ms) unless an
--                unfinished job (not 3, 5, 7) of the same identifier and queue exists. Used for
--                RECURRING jobs that finished and for WaitingException. A FINISHED RECURRING
--                job's own row is then deleted, so one row per identifier remains.
--   p_now      the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: OUT parameter, no rows: o_written, JSON text, an array with one object per result
--   that was written (the others were fenced out), in no particular order:
--   {"id", "promoted_id", "clone_id"}: promoted_id is the job of the group that
--   background_job_group_wake moved WAITING -> READY after the group's results (on the group's last
--   written result), clone_id the copy inserted for clone_delay_ms; each NULL when none.
-- Steps: the states are checked, then every FINISHED RECURRING result that would be written
--   must carry a clone_delay_ms (so no recurring job silently stops recurring); the group rows
--   of the grouped jobs are locked; each job is updated only while it is still PROCESSING under
--   the caller's claim (finished_at set for FINISHED and REDUNDANT); the copies are inserted;
--   each group with a written result is woken (background_job_group_wake: a TEMPORARILY_FAILED
--   head is normally still first in line, so it wakes nobody; a better-priority job that waited
--   behind it while it ran is promoted). (MySQL has no NOTIFY: its idle workers poll.)
-- Locks: the results one group at a time, in serial_group order (the ungrouped jobs' rows
--   first: NULL sorts first): the group's row (upsert), then its job rows, then the row
--   background_job_group_wake promotes, then the next group. Within a group that is the claims'
--   order (group row, then job row). PostgreSQL's twin takes every group row first, then the
--   job rows; on both, a group's row is locked before its jobs' rows, and groups in
--   serial_group order.
-- Fencing: each row is written only WHERE state = 2 AND number_of_attempts = attempt. A worker
--   whose job was reaped and claimed again elsewhere presents an old token: nothing changes,
--   and no copy is made, no group woken.
-- Errors: 31002 / SQLSTATE BQ002 (raised before anything is written) when a state is not 1, 3,
--   4, 5 or 7, or when a FINISHED RECURRING job would be written without a clone_delay_ms.
-- Idempotent: yes (a repeated call is fenced out: nothing written).
-- MySQL 8: JSON_TABLE (8.0.4+) is accepted by MariaDB 10.11 and MySQL 8 alike.
-- Group row: the upsert of each result's group row always changes it (macros/rules.sql
--   group_touch), so a result and another node's claim of the same group conflict on Galera
--   (one fails certification at COMMIT, 1213) as the claims do with each other; a row lock
--   holds on one node only. Version 5: the upsert wrote updated_at = p_now.
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE background_job_finish_results(
    IN p_results LONGTEXT,
    IN p_now DATETIME(6),
    OUT o_written LONGTEXT
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_id BIGINT UNSIGNED;
    DECLARE v_attempt INT;
    DECLARE v_state INT;
    DECLARE v_error LONGTEXT;
    DECLARE v_postponed_by INT;
    DECLARE v_execution_time INT;
    DECLARE v_memory LONGTEXT;
    DECLARE v_clone_delay INT;
    DECLARE v_group VARCHAR(255);
    DECLARE v_locked VARCHAR(255) DEFAULT NULL;
    DECLARE v_wake INT DEFAULT 0;
    DECLARE v_promoted BIGINT UNSIGNED;
    DECLARE v_clone BIGINT UNSIGNED;
    DECLARE v_identifier VARCHAR(255);
    DECLARE v_queue VARCHAR(255);
    DECLARE v_mode VARCHAR(16);
    DECLARE v_recurring INT DEFAULT 0;
    DECLARE v_cancelled INT DEFAULT 0;
    -- One row at a time, by primary key, in serial_group order: no statement can scan (and wait
    -- for) rows of other transactions, and group rows are locked in one order. (The read of
    -- serial_group is a plain, non-locking read; a job's group never changes.)
    DECLARE results CURSOR FOR
        SELECT
            r.id,
            r.attempt,
            r.state,
            r.error,
            r.postponed_by,
            r.execution_time,
            r.memory,
            r.clone_delay_ms,
            j.serial_group
        FROM
            JSON_TABLE(
                p_results, '$[*]' COLUMNS (
                    id BIGINT UNSIGNED PATH '$.id',
                    attempt INT PATH '$.attempt',
                    state INT PATH '$.state',
                    error LONGTEXT PATH '$.error',
                    postponed_by INT PATH '$.postponed_by',
                    execution_time INT PATH '$.execution_time',
                    memory JSON PATH '$.memory',
                    clone_delay_ms INT PATH '$.clone_delay_ms'
                )
            ) AS r
        LEFT JOIN background_job AS j ON j.id = r.id
        ORDER BY j.serial_group, r.id;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;

    IF EXISTS (
        SELECT 1 FROM JSON_TABLE(p_results, '$[*]' COLUMNS (state INT PATH '$.state')) AS r
        WHERE r.state IS NULL OR r.state NOT IN (1, 3, 4, 5, 7)
    ) THEN
        SIGNAL SQLSTATE 'BQ002'
            SET MYSQL_ERRNO = 31002, MESSAGE_TEXT = 'bgq: a result state must be 1, 3, 4, 5 or 7';
    END IF;
    -- SELECT ... INTO is a plain read; IF EXISTS (SELECT ...) would be a locking one in MySQL.
    SELECT COUNT(*) INTO v_recurring
    FROM
        JSON_TABLE(
            p_results, '$[*]' COLUMNS (
                id BIGINT UNSIGNED PATH '$.id',
                attempt INT PATH '$.attempt',
                state INT PATH '$.state',
                clone_delay_ms INT PATH '$.clone_delay_ms'
            )
        ) AS r
    INNER JOIN background_job AS j ON j.id = r.id
    WHERE
        r.state = 3
        AND r.clone_delay_ms IS NULL
        AND j.mode = 'recurring'
        AND j.state = 2
        AND j.number_of_attempts = r.attempt;
    IF v_recurring > 0 THEN
        SIGNAL SQLSTATE 'BQ002'
            SET MYSQL_ERRNO = 31002,
            MESSAGE_TEXT = 'bgq: a finished recurring job needs clone_delay_ms, the delay of its successor';
    END IF;

    SET o_written = JSON_ARRAY();
    OPEN results;
    result_loop: LOOP
        FETCH results INTO v_id, v_attempt, v_state, v_error, v_postponed_by, v_execution_time,
        v_memory, v_clone_delay, v_group;
        IF v_done = 1 OR NOT (v_group <=> v_locked) THEN
            IF v_wake = 1 THEN
                -- The group's promoted job goes on its last written result (the one appended last).
                CALL background_job_group_wake(v_locked, v_now, v_promoted);
                SET o_written = JSON_SET(
                    o_written, CONCAT('$[', JSON_LENGTH(o_written) - 1, '].promoted_id'), v_promoted
                );
                SET v_wake = 0;
            END IF;
            IF v_done = 1 THEN
                LEAVE result_loop;
            END IF;
            IF v_group IS NOT NULL THEN
                INSERT INTO background_job_group (serial_group, updated_at) VALUES (v_group, v_now)
                ON DUPLICATE KEY UPDATE updated_at = GREATEST(v_now, updated_at + INTERVAL 1 MICROSECOND);
            END IF;
            SET v_locked = v_group;
        END IF;
        -- JSON_TABLE gives a JSON null as the text 'null': store SQL NULL.
        SET v_memory = NULLIF(v_memory, 'null');
        -- A give-back (state 1) of a job whose attempt was cancelled while it was held: it is
        -- written as the cancelled job it is (REDUNDANT), not handed out again.
        SET v_cancelled = 0;
        IF v_state = 1 THEN
            SELECT COUNT(*) INTO v_cancelled
            FROM background_job
            WHERE id = v_id AND state = 2 AND number_of_attempts = v_attempt AND abort_requested_at >= last_attempt_at
            FOR UPDATE;
        END IF;
        -- The one result writer (result_write; MySQL assigns left to right: error_message reads
        -- the row before state changes).
        UPDATE background_job
        SET
            number_of_attempts = IF(
                v_state = 1 AND v_cancelled = 0, number_of_attempts - 1, number_of_attempts
            ),
            execution_time = IF(v_state = 1, execution_time, v_execution_time),
            memory = IF(v_state = 1, memory, v_memory),
            pid = IF(v_state = 1 AND v_cancelled = 0, NULL, pid),
            metadata = IF(v_state = 1, NULL, metadata),
            finished_at = IF(v_state IN (3, 7) OR v_cancelled = 1, v_now, finished_at),
            error_message = IF(v_cancelled = 1, error_message, v_error),
            postponed_by = IF(v_cancelled = 1, NULL, v_postponed_by),
            updated_at = v_now,
            state = IF(v_cancelled = 1, 7, v_state)
        WHERE id = v_id AND state = 2 AND number_of_attempts = v_attempt;
        IF ROW_COUNT() > 0 THEN
            SET v_clone = NULL;
            IF v_clone_delay IS NOT NULL THEN
                -- The copy (RECURRING, WaitingException).
                SELECT
                    identifier,
                    queue,
                    mode
                INTO v_identifier, v_queue, v_mode
                FROM background_job
                WHERE id = v_id;
                IF v_identifier IS NULL OR NOT EXISTS (
                    SELECT 1 FROM background_job
                    WHERE
                        identifier = v_identifier
                        AND queue = v_queue
                        AND state NOT IN (3, 5, 7)
                ) THEN
                    INSERT INTO background_job (
                        queue, priority, callback_name, parameters, parameters_json, state, created_at,
                        number_of_attempts, serial_group, coalesce_threshold, identifier, mode,
                        postponed_by, processed_by_broker, updated_at
                    )
                    SELECT
                        queue,
                        priority,
                        callback_name,
                        parameters,
                        parameters_json,
                        1 AS state,
                        v_now AS created_at,
                        0 AS number_of_attempts,
                        serial_group,
                        coalesce_threshold,
                        identifier,
                        mode,
                        v_clone_delay AS postponed_by,
                        processed_by_broker,
                        v_now AS updated_at
                    FROM background_job
                    WHERE id = v_id;
                    SET v_clone = LAST_INSERT_ID();
                END IF;
                IF v_mode = 'recurring' AND v_state = 3 THEN
                    DELETE FROM background_job
                    WHERE id = v_id;
                END IF;
            END IF;
            SET o_written = JSON_ARRAY_APPEND(
                o_written, '$', JSON_OBJECT('id', v_id, 'promoted_id', NULL, 'clone_id', v_clone)
            );
            SET v_wake = IF(v_group IS NULL, 0, 1);
        END IF;
    END LOOP;
    CLOSE results;
END
