-- bgq background_job_hand_off, version 4 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_hand_off(p_results, p_groups, p_queue, p_pid, p_min_priority, p_max_priority,
--                             p_waiting_ms, p_worker_id, p_now)
--   A worker writes its results and claims the next head of each of its groups in one call and
--   one transaction: a group it hands on never stands idle between its job and the next, and no
--   other worker takes it. `bgq work` writes every batch of results this way.
--   p_results       NULL, or the results to write first: the JSON of background_job_finish_batch.
--   p_groups        JSON text: an array of serial group names (duplicates and nulls ignored),
--                   the groups whose next head is claimed; [] claims nothing.
--   p_queue         the base queue: a head must be in it or in a sub-queue '<p_queue>_<sub>'.
--   p_pid           the worker's process id (stored for people).
--   p_min_priority, p_max_priority: a head's priority must lie in this range (NULL: no bound).
--   p_waiting_ms    passed to background_job_claim_job (a head that lost a race turns WAITING).
--   p_worker_id     stored in worker_id on every claimed job (NULL: none).
--   p_now           the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: first one row per p_results object, then at most one claimed job per group (in no
--   particular order)
--   id, attempt     the job and, for a claimed job, its claim token for background_job_finish,
--                   background_job_finish_batch or the next background_job_hand_off.
--   callback_name, parameters_json, parameters, queue, priority, serial_group, identifier,
--   mode, coalesce_threshold: the claimed job as stored (NULL on the result rows).
--   finished        on a result row: 1 if written, 0 if fenced out; NULL on a claimed row.
-- Claimable: a group's head (first in (priority, id) among the group's unstarted jobs of every
--   queue and state -1, 1, 4, 6, 8, due or not; one index dive on background_job_pending_head)
--   when it is READY, TEMPORARILY_FAILED, WAITING or BROKER_FAILED, due (as in
--   background_job_due_jobs without a broker), of the queue and priority range, while no job of
--   the group is PROCESSING. Nothing else: order inside a group never bends.
-- Steps: the results are written by background_job_finish_results' writer (result_write in
--   macros/rules.sql), then the heads are claimed. Three ways, with the same effects:
--   - the short way, a lone group's chain: one FINISHED result without a copy, of a NORMAL or
--     UNIQUE job of the one group of p_groups: the group row locked (upsert), the job written
--     (fenced), the group woken if it has a WAITING job or a recorded waiting head
--     (background_job_group_wake), and its head claimed, by plain statements;
--   - the batch way, when every result is FINISHED without a copy and no job is RECURRING: the
--     group rows of the results' groups locked (upserts, in serial_group order), the jobs
--     written by one UPDATE (fenced), each group with a WAITING job or a recorded waiting head
--     woken; then the group rows of p_groups locked without waiting, and the heads of the
--     locked groups claimed together;
--   - any other batch goes through background_job_finish_results (its errors included), then the
--     heads are claimed as in the batch way.
--   A head is claimed under its group lock: a NORMAL head without a coalescing threshold, not
--   WAITING, by an UPDATE of the columns background_job_claim_job writes (PROCESSING, attempts + 1,
--   last_attempt_at, pid, worker_id; postponed_by, error_message and metadata cleared; being
--   the head in a group without a PROCESSING job is what its predecessor check asks); any other
--   head, and the head of a group without a row yet, through background_job_claim_job, which
--   re-checks it under the group lock (predecessor, UNIQUE duplicate, coalescing). Only
--   'claimed' heads are returned.
-- Locks: the group rows of the results' groups (upserts, in serial_group order: a result waits
--   for its group row), then the job rows, then the group rows of p_groups FOR UPDATE SKIP
--   LOCKED (held already for a group whose job p_results finished): a group row another
--   transaction holds is not waited for, and that group's head is left alone. Only a group that
--   has no row yet gets it from background_job_claim_job, which waits at most
--   3 s for a concurrent first claim.
-- Fencing: each result is written only WHERE state = 2 AND number_of_attempts = attempt; each
--   claim is conditional on a claimable state.
-- Errors: 31002 / SQLSTATE BQ002 (nothing written) when p_groups is not a JSON array; those of
--   background_job_finish_results.
-- Idempotent: no (a second call may claim the next heads); a claimed job is never claimed again.
-- MySQL 8: SKIP LOCKED (8.0.1+), JSON_TABLE (8.0.4+) and JSON_ARRAYAGG (8.0.14+) are accepted by
--   MariaDB 10.11 and MySQL 8 alike.
-- Group row (every claim of a group's job writes it, the rule of every claiming procedure): the
--   results' group rows are upserted with a write that always changes them (macros/rules.sql
--   group_touch), and every head is claimed by background_job_claim_heads or
--   background_job_claim_job, which write the head's group row; the short way's one group row is
--   that upsert. On Galera, two nodes' claims of one group so write one row, and one of them
--   fails certification at COMMIT (1213, retried by the caller). Version 4: the upserts wrote
--   updated_at = p_now (no change, so no write, for a repeated clock).
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT at READ COMMITTED.
CREATE PROCEDURE background_job_hand_off(
    IN p_results LONGTEXT,
    IN p_groups LONGTEXT,
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
    DECLARE v_claimed LONGTEXT DEFAULT '[]';
    DECLARE v_group VARCHAR(255) COLLATE utf8mb4_bin DEFAULT NULL;
    DECLARE v_head BIGINT UNSIGNED DEFAULT NULL;
    DECLARE v_outcome VARCHAR(16);
    DECLARE v_attempt INT;
    DECLARE v_state SMALLINT;
    DECLARE v_predecessor BIGINT UNSIGNED;
    DECLARE v_promoted BIGINT UNSIGNED;
    DECLARE v_id BIGINT UNSIGNED DEFAULT NULL;
    DECLARE v_result_attempt INT;
    DECLARE v_error LONGTEXT;
    DECLARE v_postponed_by INT;
    DECLARE v_execution_time INT;
    DECLARE v_memory LONGTEXT;
    DECLARE v_job_group VARCHAR(255) COLLATE utf8mb4_bin DEFAULT NULL;
    DECLARE v_job_mode VARCHAR(16) DEFAULT NULL;
    DECLARE v_waiting INT DEFAULT 0;
    DECLARE v_recorded INT DEFAULT 0;
    DECLARE v_short INT DEFAULT 0;
    DECLARE v_i INT DEFAULT 0;
    DECLARE v_count INT DEFAULT 0;
    DECLARE v_plain INT DEFAULT 1;
    DECLARE v_result_groups LONGTEXT;
    DECLARE v_wake LONGTEXT;
    DECLARE v_written_groups LONGTEXT DEFAULT '[]';
    DECLARE v_list LONGTEXT;
    DECLARE v_head_plain INT DEFAULT 0;
    DECLARE v_head_claimable INT DEFAULT 0;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;

    IF p_groups IS NULL OR JSON_TYPE(p_groups) <> 'ARRAY' THEN
        SIGNAL SQLSTATE 'BQ002'
            SET MYSQL_ERRNO = 31002, MESSAGE_TEXT = 'bgq: hand_off needs a JSON array of groups';
    END IF;

    -- The short way (see Steps) for the commonest call, a lone group's chain: one FINISHED
    -- result without a copy, of a NORMAL or UNIQUE job of the one group of p_groups, which has
    -- nothing to wake (no WAITING job, no waiting head recorded). Read with JSON_VALUE (cheaper
    -- than a JSON_TABLE for one object; a JSON null reads as NULL).
    IF
        JSON_LENGTH(p_groups) = 1
        AND p_results IS NOT NULL
        AND JSON_TYPE(p_results) = 'ARRAY'
        AND JSON_LENGTH(p_results) = 1
        AND JSON_VALUE(p_results, '$[0].state') = 3
        AND JSON_VALUE(p_results, '$[0].clone_delay_ms') IS NULL
    THEN
        SET v_group = JSON_VALUE(p_groups, '$[0]');
        -- The result, and the job's serial_group and mode (they never change: a plain read).
        -- Nothing to wake (as background_job_group_wake decides): no WAITING job, no waiting head
        -- recorded. (JSON_VALUE's text is VARCHAR(512) on MySQL 8: the error is unquoted.)
        SELECT
            j.id,
            j.serial_group,
            j.mode,
            JSON_VALUE(p_results, '$[0].attempt') AS attempt,
            IF(
                JSON_TYPE(JSON_EXTRACT(p_results, '$[0].error')) = 'STRING',
                JSON_UNQUOTE(JSON_EXTRACT(p_results, '$[0].error')),
                NULL
            ) AS error,
            JSON_VALUE(p_results, '$[0].postponed_by') AS postponed_by,
            JSON_VALUE(p_results, '$[0].execution_time') AS execution_time,
            JSON_EXTRACT(p_results, '$[0].memory') AS memory,
            EXISTS(
                SELECT 1 FROM background_job AS w
                WHERE w.serial_group = v_group AND w.state = 6
            ) AS waiting,
            EXISTS(
                SELECT 1 FROM background_job_group AS g
                WHERE g.serial_group = v_group AND g.waiting_head_id IS NOT NULL
            ) AS recorded
        INTO
        v_id, v_job_group, v_job_mode, v_result_attempt, v_error, v_postponed_by,
        v_execution_time, v_memory, v_waiting, v_recorded
        FROM background_job AS j
        WHERE j.id = JSON_VALUE(p_results, '$[0].id');
    END IF;
    IF v_job_group = v_group AND v_job_mode IN ('normal', 'unique') AND v_waiting = 0 AND v_recorded = 0 THEN
        SET v_short = 1;
        INSERT INTO background_job_group (serial_group, updated_at) VALUES (v_group, v_now)
        ON DUPLICATE KEY UPDATE updated_at = GREATEST(v_now, updated_at + INTERVAL 1 MICROSECOND);
        -- By the one result writer (a JSON null memory: NULL).
        UPDATE background_job
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
        -- The batch way: how many results, whether every one is a plain FINISHED one (see
        -- Steps), and their jobs' groups (a plain read, by primary key).
        SELECT STRAIGHT_JOIN
            COUNT(*) AS results,
            COALESCE(
                MIN(r.state = 3 AND r.clone_delay_ms IS NULL AND NOT (j.mode <=> 'recurring')), 1
            ) AS plain,
            JSON_ARRAYAGG(j.serial_group) AS result_groups
        INTO v_count, v_plain, v_result_groups
        FROM
            JSON_TABLE(
                p_results, '$[*]' COLUMNS (
                    id BIGINT UNSIGNED PATH '$.id',
                    state INT PATH '$.state',
                    clone_delay_ms INT PATH '$.clone_delay_ms'
                )
            ) AS r
        LEFT JOIN background_job AS j ON j.id = r.id;
        IF v_plain = 1 THEN
            -- The results' group rows, in serial_group order (a result waits for its group row).
            INSERT INTO background_job_group (serial_group, updated_at)
            SELECT DISTINCT
                n.name,
                v_now
            FROM JSON_TABLE(v_result_groups, '$[*]' COLUMNS (name VARCHAR(255) PATH '$')) AS n
            WHERE n.name IS NOT NULL
            ORDER BY n.name
            ON DUPLICATE KEY UPDATE updated_at = GREATEST(v_now, updated_at + INTERVAL 1 MICROSECOND);
            -- The jobs to write, locked: still PROCESSING under the results' claims; then the
            -- results written by the one result writer (a JSON null memory: NULL). Both
            -- statements reach the jobs by their primary key (see run_listed).
            SELECT GROUP_CONCAT(r.id) INTO v_list
            FROM JSON_TABLE(p_results, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$.id')) AS r;
            SET @bgq_results = p_results, @bgq_now = v_now;
            SET @bgq_sql = CONCAT('SELECT COALESCE(JSON_ARRAYAGG(JSON_OBJECT(''id'', j.id)), ''[]''), COALESCE(JSON_ARRAYAGG(j.serial_group), ''[]'') INTO @bgq_written, @bgq_groups FROM background_job AS j INNER JOIN JSON_TABLE(?, ''$[*]'' COLUMNS (id BIGINT UNSIGNED PATH ''$.id'', attempt INT PATH ''$.attempt'')) AS r ON r.id = j.id WHERE j.id IN (', v_list, ') AND j.state = 2 AND j.number_of_attempts = r.attempt FOR UPDATE');
            PREPARE bgq_hand_off_lock FROM @bgq_sql;
            EXECUTE bgq_hand_off_lock USING @bgq_results;
            DEALLOCATE PREPARE bgq_hand_off_lock;
            SET v_written = @bgq_written, v_written_groups = @bgq_groups;
            SET @bgq_sql = CONCAT('UPDATE background_job AS j INNER JOIN JSON_TABLE(?, ''$[*]'' COLUMNS (id BIGINT UNSIGNED PATH ''$.id'', attempt INT PATH ''$.attempt'', error LONGTEXT PATH ''$.error'', postponed_by INT PATH ''$.postponed_by'', execution_time INT PATH ''$.execution_time'', memory JSON PATH ''$.memory'')) AS r ON r.id = j.id SET j.execution_time = r.execution_time, j.memory = NULLIF(r.memory, ''null''), j.finished_at = ?, j.error_message = r.error, j.postponed_by = r.postponed_by, j.updated_at = ?, j.state = 3 WHERE j.id IN (', v_list, ') AND j.state = 2 AND j.number_of_attempts = r.attempt');
            PREPARE bgq_hand_off_write FROM @bgq_sql;
            EXECUTE bgq_hand_off_write USING @bgq_results, @bgq_now, @bgq_now;
            DEALLOCATE PREPARE bgq_hand_off_write;
            -- The groups to wake (a WAITING job, or a recorded waiting head), each once.
            SELECT STRAIGHT_JOIN JSON_ARRAYAGG(g.serial_group) INTO v_wake
            FROM (
                SELECT DISTINCT n.name
                FROM JSON_TABLE(v_result_groups, '$[*]' COLUMNS (name VARCHAR(255) PATH '$')) AS n
            ) AS n
            INNER JOIN background_job_group AS g ON g.serial_group = n.name COLLATE utf8mb4_bin
            WHERE
                g.waiting_head_id IS NOT NULL
                OR EXISTS (
                    SELECT 1 FROM background_job AS w
                    WHERE w.serial_group = g.serial_group AND w.state = 6
                );
            WHILE v_i < COALESCE(JSON_LENGTH(v_wake), 0) DO
                SET v_group = JSON_VALUE(v_wake, CONCAT('$[', v_i, ']'));
                CALL background_job_group_wake(v_group, v_now, v_promoted);
                SET v_i = v_i + 1;
            END WHILE;
        ELSE
            CALL background_job_finish_results(p_results, v_now, v_written);
        END IF;
    END IF;

    -- The heads: the short way's one group here, any other call's groups by
    -- background_job_claim_heads.
    IF v_short = 1 THEN
        -- The lone group's head (one index dive), claimed at once when it is a plain one and
        -- claimable here (the group row is locked already); any other head is kept for
        -- background_job_claim_job. A written result was the group's PROCESSING job, so then the
        -- group is free without a look at its running index (InnoDB's delete-marked entries of
        -- a busy group make that look slow).
        SELECT
            h.id,
            h.state IN (1, 4, 8) AND h.mode = 'normal' AND h.coalesce_threshold IS NULL AS plain,
            (
                h.state IN (1, 4, 6, 8)
                AND h.priority BETWEEN v_min AND v_max
                AND (h.queue = p_queue OR LEFT(h.queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
                AND ((h.processed_by_broker = 1 OR GREATEST(h.created_at, COALESCE(h.last_attempt_at, h.created_at))
                + INTERVAL CEIL(COALESCE(h.postponed_by, 0) / 1000) SECOND <= v_now) AND NOT EXISTS (
                    SELECT 1 FROM background_job_paused AS pz
                    WHERE
                        (
                            pz.kind = 'queue'
                            AND (
                                h.queue = pz.name
                                OR LEFT(h.queue, CHAR_LENGTH(pz.name) + 1) = CONCAT(pz.name, '_')
                            )
                        )
                        OR (pz.kind = 'group' AND h.serial_group = pz.name)
                ))
                AND IF(v_written <> '[]', TRUE, NOT EXISTS (SELECT 1 FROM background_job AS x WHERE x.running_group = v_group))
            ) AS claimable
        INTO v_head, v_head_plain, v_head_claimable
        FROM background_job AS h
        WHERE h.pending_group = v_group
        ORDER BY h.priority, h.id
        LIMIT 1;
        IF v_head_claimable = 1 AND v_head_plain = 1 THEN
            -- The same columns as background_job_claim_job writes.
            UPDATE background_job
            SET
                state = 2,
                number_of_attempts = number_of_attempts + 1,
                last_attempt_at = v_now,
                pid = p_pid,
                worker_id = p_worker_id,
                postponed_by = NULL,
                error_message = NULL,
                metadata = NULL,
                updated_at = v_now
            WHERE id = v_head AND state IN (1, 4, 8);
            SET v_claimed = IF(ROW_COUNT() > 0, JSON_ARRAY(JSON_OBJECT('claimed', v_head)), NULL);
        ELSEIF v_head_claimable = 1 THEN
            CALL background_job_claim_job(
                v_head, p_queue, p_pid, p_waiting_ms, NULL, p_worker_id, v_now,
                v_outcome, v_attempt, v_state, v_predecessor, v_promoted
            );
            IF v_outcome = 'claimed' THEN
                SET v_claimed = JSON_ARRAY(JSON_OBJECT('claimed', v_head));
            END IF;
        END IF;
    ELSE
        CALL background_job_claim_heads(
            p_groups, v_written_groups, p_queue, p_pid, p_min_priority, p_max_priority,
            p_waiting_ms, p_worker_id, v_now, v_claimed
        );
        SELECT JSON_ARRAYAGG(JSON_OBJECT('claimed', c.id)) INTO v_claimed
        FROM JSON_TABLE(v_claimed, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS c;
    END IF;
    SET v_claimed = COALESCE(v_claimed, '[]');

    -- One row per result, then the claimed jobs: one pass, no UNION and no ORDER BY (MariaDB
    -- would copy the claimed jobs' BLOB and JSON columns into a temporary table). The columns in
    -- the contract's order, the computed id first.
    SELECT  -- noqa: ST06
        COALESCE(j.id, r.id) AS id,
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
        IF(r.claimed IS NULL, IF(w.id IS NULL, 0, 1), NULL) AS finished
    FROM
        JSON_TABLE(
            JSON_MERGE_PRESERVE(COALESCE(p_results, '[]'), v_claimed),
            '$[*]' COLUMNS (
                id BIGINT UNSIGNED PATH '$.id',
                claimed BIGINT UNSIGNED PATH '$.claimed'
            )
        ) AS r
    LEFT JOIN JSON_TABLE(v_written, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$.id')) AS w
        ON r.claimed IS NULL AND w.id = r.id
    LEFT JOIN background_job AS j
        ON j.id = r.claimed AND j.state = 2
    WHERE (r.claimed IS NULL AND r.id IS NOT NULL) OR j.id IS NOT NULL;
END
