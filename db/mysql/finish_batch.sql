-- bgq {{ table }}_finish_batch, version 2 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL {{ table }}_finish_batch(p_results, p_now)
--   p_results  JSON text: an array of objects, each id at most once:
--              {"id", "attempt", "state", "error", "postponed_by", "execution_time", "memory"}
--              with the meaning of {{ table }}_finish's parameters (memory is a JSON object),
--              and one more state: 1 READY gives back a job that was claimed but never
--              started (attempts - 1, pid and metadata cleared; last_attempt_at stays).
--   p_now      the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: one row per input object
--   id        the job.
--   finished  1 if the result was written, 0 if the caller no longer owns the job.
-- The batched form of {{ table }}_finish for `bgq work`: one statement writes every result.
--   What it does not do: clones. A WaitingException's copy or a finished RECURRING job's
--   successor needs {{ table }}_finish (p_clone_delay_ms); a FINISHED RECURRING job here is an
--   error, so no recurring job can silently stop recurring. A grouped job's group is woken
--   ({{ table }}_group_wake) as by {{ table }}_finish.
-- Locks: the group rows of the grouped jobs, in serial_group order (upserts), then the job rows.
-- Fencing: each row is written only WHERE state = 2 AND number_of_attempts = attempt.
-- Errors: 31002 / SQLSTATE BQ002 (nothing written) when a state is not 1, 3, 4, 5 or 7, or
--   when a FINISHED RECURRING job would be written here.
-- Idempotent: yes (a repeated call is fenced out: finished = 0).
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE {{ table }}_finish_batch(
    IN p_results LONGTEXT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_group VARCHAR(255);
    DECLARE v_promoted BIGINT UNSIGNED;
    DECLARE v_written LONGTEXT DEFAULT NULL;
    DECLARE groups_to_wake CURSOR FOR
        SELECT DISTINCT j.serial_group
        FROM {{ table }} AS j
        WHERE j.serial_group IS NOT NULL AND JSON_CONTAINS(j.v_written, CAST(j.id AS CHAR))
        ORDER BY j.serial_group;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;

    IF EXISTS (
        SELECT 1 FROM JSON_TABLE(r.p_results, '$[*]' COLUMNS (state INT PATH '$.state')) AS r
        WHERE r.state IS NULL OR r.state NOT IN (1, 3, 4, 5, 7)
    ) THEN
        SIGNAL SQLSTATE 'BQ002'
            SET MYSQL_ERRNO = 31002, MESSAGE_TEXT = 'bgq: finish_batch state must be 1, 3, 4, 5 or 7';
    END IF;
    IF EXISTS (
        SELECT 1
        FROM
            JSON_TABLE(
                p_results, '$[*]' COLUMNS (
                    id BIGINT UNSIGNED PATH '$.id', attempt INT PATH '$.attempt', state INT PATH '$.state'
                )
            ) AS r
        INNER JOIN {{ table }} AS j ON j.id = r.id
        WHERE r.state = 3 AND j.mode = 'recurring' AND j.state = 2 AND j.number_of_attempts = r.attempt
    ) THEN
        SIGNAL SQLSTATE 'BQ002'
            SET MYSQL_ERRNO = 31002,
            MESSAGE_TEXT = 'bgq: a finished recurring job needs finish, which inserts its successor';
    END IF;

    INSERT INTO {{ table }}_group (serial_group, updated_at)
    SELECT DISTINCT
        j.serial_group,
        v_now AS updated_at
    FROM JSON_TABLE(p_results, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$.id')) AS r
    INNER JOIN {{ table }} AS j ON j.id = r.id
    WHERE j.serial_group IS NOT NULL
    ORDER BY j.serial_group
    ON DUPLICATE KEY UPDATE updated_at = v_now;

    SELECT JSON_ARRAYAGG(j.id) INTO v_written
    FROM {{ table }} AS j
    INNER JOIN JSON_TABLE(
        p_results, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$.id', attempt INT PATH '$.attempt')
    ) AS r ON r.id = j.id
    WHERE j.state = 2 AND j.number_of_attempts = r.attempt
    FOR UPDATE;
    SET v_written = COALESCE(v_written, '[]');

    UPDATE {{ table }} AS j
        INNER JOIN JSON_TABLE(  -- noqa: LT02
            p_results, '$[*]' COLUMNS (
                id BIGINT UNSIGNED PATH '$.id',
                attempt INT PATH '$.attempt',
                state INT PATH '$.state',
                error LONGTEXT PATH '$.error',
                postponed_by INT PATH '$.postponed_by',
                execution_time INT PATH '$.execution_time',
                memory JSON PATH '$.memory'
            )
        ) AS r ON r.id = j.id
    SET
        j.number_of_attempts = CASE
            WHEN r.state = 1 THEN j.number_of_attempts - 1 ELSE j.number_of_attempts
        END,
        j.execution_time = CASE WHEN r.state = 1 THEN j.execution_time ELSE r.execution_time END,
        j.memory = CASE WHEN r.state = 1 THEN j.memory ELSE r.memory END,
        j.pid = CASE WHEN r.state = 1 THEN NULL ELSE j.pid END,
        j.metadata = CASE WHEN r.state = 1 THEN NULL ELSE j.metadata END,
        j.finished_at = CASE WHEN r.state IN (3, 7) THEN v_now ELSE j.finished_at END,
        j.error_message = r.error,
        j.postponed_by = r.postponed_by,
        j.updated_at = v_now,
        j.state = r.state
    WHERE j.state = 2 AND j.number_of_attempts = r.attempt;

    OPEN groups_to_wake;
    wake_loop: LOOP
        FETCH groups_to_wake INTO v_group;
        IF v_done = 1 THEN
            LEAVE wake_loop;
        END IF;
        CALL {{ table }}_group_wake(v_group, v_now, v_promoted);
        SET v_done = 0;
    END LOOP;
    CLOSE groups_to_wake;

    SELECT
        r.id,
        CASE WHEN JSON_CONTAINS(r.v_written, CAST(r.id AS CHAR)) THEN 1 ELSE 0 END AS finished
    FROM JSON_TABLE(r.p_results, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$.id')) AS r;
END
