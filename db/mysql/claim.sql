-- bgq {{ table }}_claim, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL {{ table }}_claim(p_id, p_queue, p_pid, p_waiting_ms, p_metadata, p_now)
--   p_id          the job to claim.
--   p_queue       the base queue: the job must be in it or in a sub-queue '<p_queue>_<sub>'.
--   p_pid         the worker's process id (stored for people, never used for liveness).
--   p_waiting_ms  postponed_by written when the job has to wait (waiting_job_expiration).
--   p_metadata    JSON stored in metadata on a successful claim (NULL stores NULL).
--   p_now         the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: exactly one row
--   outcome         'claimed'    the job is PROCESSING and belongs to the caller;
--                   'waiting'    a predecessor exists: the job is WAITING (conditional write);
--                   'redundant'  UNIQUE job with an older row of its identifier: REDUNDANT;
--                   'locked'     the group row stayed locked for 3 s: nothing changed;
--                   'missing'    no such job in this queue;
--                   'skipped'    FINISHED or REDUNDANT already (an expected duplicate);
--                   'unexpected' PROCESSING or PERMANENTLY_FAILED: nothing changed.
--   attempt         number_of_attempts after the claim: the fencing token that
--                   {{ table }}_finish must present. NULL unless claimed.
--   state           the job's state after the call (NULL when missing or locked).
--   predecessor_id  the job it waits for ('waiting').
--   promoted_id     a job of the group this call moved WAITING -> READY (publish it).
--   callback_name, parameters_json, parameters, queue, priority, serial_group, identifier,
--   mode, coalesce_threshold: the job as stored (NULL when missing).
-- Steps: a claimable state is -1, 1, 4, 6, 8. A grouped job first locks its group row; then the
--   job is re-read under the lock; a UNIQUE duplicate turns REDUNDANT; a job with a predecessor
--   ({{ table }}_predecessor) turns WAITING; otherwise it is claimed (PROCESSING, attempts + 1,
--   last_attempt_at, pid, metadata; postponed_by and error_message cleared) and, with a
--   coalesce_threshold, swallows the unstarted jobs of its group whose threshold is >= its own
--   (REDUNDANT). {{ table }}_group_wake then refreshes the group row.
-- Locks: the group row (waits at most 3 s: innodb_lock_wait_timeout is set to 3 for that one
--   statement and restored at once, also on error), then the job row (FOR UPDATE). Reads after
--   the lock are locking reads, so REPEATABLE READ sees the latest committed rows.
-- Fencing: every write is conditional on a claimable state; a job claimed elsewhere first is
--   'unexpected' or 'skipped' here and nothing is written.
-- Errors: none of its own. Idempotent: a second call on a claimed job is 'unexpected'.
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE {{ table }}_claim(
    IN p_id BIGINT UNSIGNED,
    IN p_queue VARCHAR(255),
    IN p_pid INT,
    IN p_waiting_ms INT,
    IN p_metadata LONGTEXT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_old_wait INT DEFAULT @@SESSION.innodb_lock_wait_timeout;
    DECLARE v_outcome VARCHAR(16) DEFAULT NULL;
    DECLARE v_found INT DEFAULT 1;
    DECLARE v_group VARCHAR(255) DEFAULT NULL;
    DECLARE v_mode VARCHAR(16) DEFAULT NULL;
    DECLARE v_identifier VARCHAR(255) DEFAULT NULL;
    DECLARE v_state SMALLINT DEFAULT NULL;
    DECLARE v_attempt INT DEFAULT NULL;
    DECLARE v_threshold BIGINT DEFAULT NULL;
    DECLARE v_predecessor BIGINT UNSIGNED DEFAULT NULL;
    DECLARE v_promoted BIGINT UNSIGNED DEFAULT NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        SET SESSION innodb_lock_wait_timeout = v_old_wait;
        RESIGNAL;
    END;

    body: BEGIN
        DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;

        -- serial_group, mode and identifier never change, so a plain read is enough here.
        SELECT
            serial_group,
            mode,
            identifier
        INTO v_group, v_mode, v_identifier
        FROM {{ table }}
        WHERE
            id = p_id
            AND (queue = p_queue OR LEFT(queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'));
        IF v_found = 0 THEN
            SET v_outcome = 'missing';
            LEAVE body;
        END IF;

        IF v_group IS NOT NULL THEN
            group_lock: BEGIN
                -- Only this statement turns a lock-wait timeout into 'locked'; nothing is written yet.
                DECLARE EXIT HANDLER FOR 1205 SET v_outcome = 'locked';
                SET SESSION innodb_lock_wait_timeout = 3;
                INSERT INTO {{ table }}_group (serial_group, updated_at) VALUES (v_group, v_now)
                ON DUPLICATE KEY UPDATE updated_at = v_now;
            END group_lock;
            SET SESSION innodb_lock_wait_timeout = v_old_wait;
            IF v_outcome = 'locked' THEN
                LEAVE body;
            END IF;
        END IF;

        SELECT
            state,
            number_of_attempts,
            coalesce_threshold
        INTO v_state, v_attempt, v_threshold
        FROM {{ table }}
        WHERE id = p_id
        FOR UPDATE;
        IF v_found = 0 THEN
            SET v_outcome = 'missing', v_state = NULL;
            LEAVE body;
        END IF;
        SET v_attempt = NULL;
        IF v_state IN (3, 7) THEN
            SET v_outcome = 'skipped';
            LEAVE body;
        END IF;
        IF v_state NOT IN (-1, 1, 4, 6, 8) THEN
            SET v_outcome = 'unexpected';
            LEAVE body;
        END IF;

        IF v_mode = 'unique' AND EXISTS (
            SELECT 1 FROM {{ table }}
            WHERE
                identifier = v_identifier AND id < p_id
                AND (queue = p_queue OR LEFT(queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
        ) THEN
            UPDATE {{ table }}
            SET state = 7, finished_at = v_now, updated_at = v_now
            WHERE id = p_id;
            SET v_outcome = 'redundant', v_state = 7;
        ELSEIF v_group IS NOT NULL THEN
            SET v_predecessor = {{ table }}_predecessor(p_id);
            IF v_predecessor IS NOT NULL THEN
                UPDATE {{ table }}
                SET
                    state = 6,
                    error_message = CONCAT('Waiting for job ID ', v_predecessor),
                    postponed_by = p_waiting_ms,
                    updated_at = v_now
                WHERE id = p_id AND state IN (-1, 1, 4, 6, 8);
                SET v_outcome = 'waiting', v_state = 6;
            END IF;
        END IF;

        IF v_outcome IS NULL THEN
            UPDATE {{ table }}
            SET
                state = 2,
                number_of_attempts = number_of_attempts + 1,
                last_attempt_at = v_now,
                pid = p_pid,
                postponed_by = NULL,
                error_message = NULL,
                metadata = p_metadata,
                updated_at = v_now
            WHERE id = p_id AND state IN (-1, 1, 4, 6, 8);
            SELECT number_of_attempts INTO v_attempt
            FROM {{ table }}
            WHERE id = p_id;
            SET v_outcome = 'claimed', v_state = 2;
            IF v_threshold IS NOT NULL AND v_group IS NOT NULL THEN
                UPDATE {{ table }}
                SET state = 7, finished_at = v_now, updated_at = v_now
                WHERE
                    serial_group = v_group
                    AND state IN (-1, 1, 4, 6, 8)
                    AND id <> p_id
                    AND coalesce_threshold >= v_threshold;
            END IF;
        END IF;

        IF v_group IS NOT NULL THEN
            CALL {{ table }}_group_wake(v_group, v_now, v_promoted);
        END IF;
    END body;

    SET SESSION innodb_lock_wait_timeout = v_old_wait;
    SELECT
        v_outcome AS outcome,
        v_attempt AS attempt,
        v_state AS state,
        v_predecessor AS predecessor_id,
        v_promoted AS promoted_id,
        j.callback_name,
        j.parameters_json,
        j.parameters,
        j.queue,
        j.priority,
        j.serial_group,
        j.identifier,
        j.mode,
        j.coalesce_threshold
    FROM (SELECT p_id AS id) AS k
    LEFT JOIN {{ table }} AS j ON j.id = k.id AND v_outcome <> 'missing';
END
