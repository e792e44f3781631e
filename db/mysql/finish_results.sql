-- bgq {{ table }}_finish_results, version 2 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL {{ table }}_finish_results(p_results, p_now, @written)
--   What {{ table }}_finish_batch does, without its result rows: the one place where batched
--   results are written. {{ table }}_finish_batch and {{ table }}_claim_batch (its p_results)
--   call it. Parameters as in {{ table }}_finish_batch.
-- Result: OUT parameter, no rows: o_written, the ids whose result was written (the others were
--   fenced out).
-- Locks, Fencing, Idempotent, Transaction: as documented in {{ table }}_finish_batch.
-- Errors: 31002 / SQLSTATE BQ002 (nothing written) when a state is not 1, 3, 4, 5 or 7, or
--   when a FINISHED RECURRING job would be written here.
CREATE PROCEDURE {{ table }}_finish_results(
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
    DECLARE v_group VARCHAR(255);
    DECLARE v_locked VARCHAR(255) DEFAULT NULL;
    DECLARE v_wake INT DEFAULT 0;
    DECLARE v_promoted BIGINT UNSIGNED;
    DECLARE v_recurring INT DEFAULT 0;
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
                    memory JSON PATH '$.memory'
                )
            ) AS r
        LEFT JOIN {{ table }} AS j ON j.id = r.id
        ORDER BY j.serial_group, r.id;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;

    IF EXISTS (
        SELECT 1 FROM JSON_TABLE(p_results, '$[*]' COLUMNS (state INT PATH '$.state')) AS r
        WHERE r.state IS NULL OR r.state NOT IN (1, 3, 4, 5, 7)
    ) THEN
        SIGNAL SQLSTATE 'BQ002'
            SET MYSQL_ERRNO = 31002, MESSAGE_TEXT = 'bgq: finish_batch state must be 1, 3, 4, 5 or 7';
    END IF;
    -- SELECT ... INTO is a plain read; IF EXISTS (SELECT ...) would be a locking one in MySQL.
    SELECT COUNT(*) INTO v_recurring
    FROM
        JSON_TABLE(
            p_results, '$[*]' COLUMNS (
                id BIGINT UNSIGNED PATH '$.id', attempt INT PATH '$.attempt', state INT PATH '$.state'
            )
        ) AS r
    INNER JOIN {{ table }} AS j ON j.id = r.id
    WHERE r.state = 3 AND j.mode = 'recurring' AND j.state = 2 AND j.number_of_attempts = r.attempt;
    IF v_recurring > 0 THEN
        SIGNAL SQLSTATE 'BQ002'
            SET MYSQL_ERRNO = 31002,
            MESSAGE_TEXT = 'bgq: a finished recurring job needs finish, which inserts its successor';
    END IF;

    SET o_written = '[]';
    OPEN results;
    result_loop: LOOP
        FETCH results INTO v_id, v_attempt, v_state, v_error, v_postponed_by, v_execution_time,
        v_memory, v_group;
        IF v_done = 1 OR NOT (v_group <=> v_locked) THEN
            IF v_wake = 1 THEN
                CALL {{ table }}_group_wake(v_locked, v_now, v_promoted);
                SET v_wake = 0;
            END IF;
            IF v_done = 1 THEN
                LEAVE result_loop;
            END IF;
            IF v_group IS NOT NULL THEN
                INSERT INTO {{ table }}_group (serial_group, updated_at) VALUES (v_group, v_now)
                ON DUPLICATE KEY UPDATE updated_at = v_now;
            END IF;
            SET v_locked = v_group;
        END IF;
        -- JSON_TABLE gives a JSON null as the text 'null': store SQL NULL.
        SET v_memory = NULLIF(v_memory, 'null');
        UPDATE {{ table }}
        SET
            number_of_attempts = IF(v_state = 1, number_of_attempts - 1, number_of_attempts),
            execution_time = IF(v_state = 1, execution_time, v_execution_time),
            memory = IF(v_state = 1, memory, v_memory),
            pid = IF(v_state = 1, NULL, pid),
            metadata = IF(v_state = 1, NULL, metadata),
            finished_at = IF(v_state IN (3, 7), v_now, finished_at),
            error_message = v_error,
            postponed_by = v_postponed_by,
            updated_at = v_now,
            state = v_state
        WHERE id = v_id AND state = 2 AND number_of_attempts = v_attempt;
        IF ROW_COUNT() > 0 THEN
            SET o_written = JSON_ARRAY_APPEND(o_written, '$', v_id);
            SET v_wake = IF(v_group IS NULL, 0, 1);
        END IF;
    END LOOP;
    CLOSE results;
END
