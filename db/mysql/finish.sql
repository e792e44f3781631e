-- bgq {{ table }}_finish, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL {{ table }}_finish(p_id, p_attempt, p_state, p_error, p_postponed_by,
--                           p_execution_time, p_memory, p_clone_delay_ms, p_now)
--   p_id              the job.
--   p_attempt         the claim token returned by {{ table }}_claim (its `attempt`).
--   p_state           the outcome: 3 FINISHED, 4 TEMPORARILY_FAILED, 5 PERMANENTLY_FAILED or
--                     7 REDUNDANT.
--   p_error           error_message to store (NULL on success).
--   p_postponed_by    ms before the job may run again (the backoff of a temporary failure).
--   p_execution_time  ms the callback took (NULL when it did not succeed).
--   p_memory          JSON {"before": ..., "after": ...} (NULL when it did not succeed).
--   p_clone_delay_ms  NULL, or: publish a fresh copy of the job (same callback, parameters,
--                     queue, priority, group, identifier, mode, coalesce_threshold; READY,
--                     attempts 0) due after this many ms, unless an unfinished job (not 3, 5,
--                     7) of the same identifier exists. Used for RECURRING jobs that finished
--                     and for WaitingException. A FINISHED RECURRING job's own row is then
--                     deleted, so one row per identifier remains.
--   p_now             the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: exactly one row
--   finished           1 if the result was written, 0 if the caller no longer owns the job.
--   promoted_id        the group's WAITING head that this finish moved to READY, or NULL.
--   promoted_queue, promoted_priority: where to publish promoted_id in broker mode.
--   clone_id           the copy inserted for p_clone_delay_ms, or NULL (it has the job's queue
--                      and priority; publish it with delay p_clone_delay_ms in broker mode).
-- Steps: a grouped job locks its group row first; the job is updated only while it is still
--   PROCESSING under the caller's claim; finished_at is set for FINISHED and REDUNDANT; then
--   {{ table }}_group_wake promotes the group's WAITING head when nothing blocks it any more
--   (a TEMPORARILY_FAILED job is normally still first in line, so it wakes nobody; a
--   better-priority job that waited behind it while it ran is promoted).
-- Locks: the group row, then the job row, then the promoted row (the same order as the claim).
-- Fencing: WHERE state = 2 AND number_of_attempts = p_attempt. A worker whose job was reaped
--   and claimed again elsewhere presents an old token: finished = 0 and nothing changes.
-- Errors: 31002 / SQLSTATE BQ002 when p_state is not 3, 4, 5 or 7.
-- Idempotent: yes (a repeated call is fenced out: finished = 0).
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE {{ table }}_finish(
    IN p_id BIGINT UNSIGNED,
    IN p_attempt INT,
    IN p_state SMALLINT,
    IN p_error LONGTEXT,
    IN p_postponed_by INT,
    IN p_execution_time INT,
    IN p_memory LONGTEXT,
    IN p_clone_delay_ms INT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_group VARCHAR(255) DEFAULT NULL;
    DECLARE v_finished INT DEFAULT 0;
    DECLARE v_promoted BIGINT UNSIGNED DEFAULT NULL;
    DECLARE v_clone BIGINT UNSIGNED DEFAULT NULL;
    DECLARE v_identifier VARCHAR(255) DEFAULT NULL;
    DECLARE v_queue VARCHAR(255) DEFAULT NULL;
    DECLARE v_mode VARCHAR(16) DEFAULT NULL;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;

    IF p_state IS NULL OR p_state NOT IN (3, 4, 5, 7) THEN
        SIGNAL SQLSTATE 'BQ002'
            SET MYSQL_ERRNO = 31002, MESSAGE_TEXT = 'bgq: finish state must be 3, 4, 5 or 7';
    END IF;

    SELECT serial_group INTO v_group
    FROM {{ table }}
    WHERE id = p_id;
    IF v_group IS NOT NULL THEN
        INSERT INTO {{ table }}_group (serial_group, updated_at) VALUES (v_group, v_now)
        ON DUPLICATE KEY UPDATE updated_at = v_now;
    END IF;

    UPDATE {{ table }}
    SET
        state = p_state,
        error_message = p_error,
        postponed_by = p_postponed_by,
        execution_time = p_execution_time,
        memory = p_memory,
        finished_at = CASE WHEN p_state IN (3, 7) THEN v_now ELSE finished_at END,
        updated_at = v_now
    WHERE id = p_id AND state = 2 AND number_of_attempts = p_attempt;
    SET v_finished = ROW_COUNT();

    IF v_finished > 0 AND p_clone_delay_ms IS NOT NULL THEN
        SELECT
            identifier,
            queue,
            mode
        INTO v_identifier, v_queue, v_mode
        FROM {{ table }}
        WHERE id = p_id;
        IF v_identifier IS NULL OR NOT EXISTS (
            SELECT 1 FROM {{ table }}
            WHERE
                identifier = v_identifier
                AND queue = v_queue
                AND state NOT IN (3, 5, 7)
        ) THEN
            INSERT INTO {{ table }} (
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
                p_clone_delay_ms AS postponed_by,
                processed_by_broker,
                v_now AS updated_at
            FROM {{ table }}
            WHERE id = p_id;
            SET v_clone = LAST_INSERT_ID();
        END IF;
        IF v_mode = 'recurring' AND p_state = 3 THEN
            DELETE FROM {{ table }}
            WHERE id = p_id;
        END IF;
    END IF;

    IF v_finished > 0 AND v_group IS NOT NULL THEN
        CALL {{ table }}_group_wake(v_group, v_now, v_promoted);
    END IF;

    SELECT
        v_finished AS finished,
        v_promoted AS promoted_id,
        p.queue AS promoted_queue,
        p.priority AS promoted_priority,
        v_clone AS clone_id
    FROM (SELECT v_promoted AS id) AS k
    LEFT JOIN {{ table }} AS p ON p.id = k.id;
END
