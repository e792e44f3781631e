-- bgq background_job_claim_job, version 4 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_claim_job(p_id, p_queue, p_pid, p_waiting_ms, p_metadata, p_worker_id,
--                              p_now, @outcome, @attempt, @state, @predecessor_id, @promoted_id)
--   The one place where a single job is claimed: background_job_claim (cron and broker mode),
--   background_job_claim_batch (grouped heads and UNIQUE jobs) and background_job_hand_off call it.
--   Parameters as in background_job_claim.
-- Result: OUT parameters, no rows: a nested CALL must not send any
--   o_outcome, o_attempt, o_state, o_predecessor_id, o_promoted_id: outcome, attempt, state,
--   predecessor_id and promoted_id as documented in background_job_claim.
-- Steps, Locks, Fencing, Errors, Idempotent: as documented in background_job_claim
--   (innodb_lock_wait_timeout is 3 for the group row's upsert only and
--   restored at once, also on error).
-- Group row (every claim of a group's job writes it, the rule of every claiming procedure): the
--   upsert of the group row always changes it (macros/rules.sql group_touch: updated_at moves
--   by at least 1 us), whatever the claim's outcome. A row lock holds on one Galera node only;
--   two nodes' claims of one group both write this row, so one of them fails certification at
--   COMMIT (1213, retried by the caller) and never both claim. Version 4: the upsert wrote
--   updated_at = p_now, which left the row unchanged for a repeated clock (no write on Galera).
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE background_job_claim_job(
    IN p_id BIGINT UNSIGNED,
    IN p_queue VARCHAR(255),
    IN p_pid INT,
    IN p_waiting_ms INT,
    IN p_metadata LONGTEXT,
    IN p_worker_id BIGINT,
    IN p_now DATETIME(6),
    OUT o_outcome VARCHAR(16),
    OUT o_attempt INT,
    OUT o_state SMALLINT,
    OUT o_predecessor_id BIGINT UNSIGNED,
    OUT o_promoted_id BIGINT UNSIGNED
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_old_wait INT DEFAULT @@SESSION.innodb_lock_wait_timeout;
    DECLARE v_found INT DEFAULT 1;
    DECLARE v_group VARCHAR(255) DEFAULT NULL;
    DECLARE v_mode VARCHAR(16) DEFAULT NULL;
    DECLARE v_identifier VARCHAR(255) DEFAULT NULL;
    DECLARE v_threshold BIGINT DEFAULT NULL;
    DECLARE v_before SMALLINT DEFAULT NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        SET SESSION innodb_lock_wait_timeout = v_old_wait;
        RESIGNAL;
    END;

    SET o_outcome = NULL, o_attempt = NULL, o_state = NULL, o_predecessor_id = NULL,
    o_promoted_id = NULL;

    body: BEGIN
        DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;

        -- serial_group, mode and identifier never change, so a plain read is enough here.
        SELECT
            serial_group,
            mode,
            identifier
        INTO v_group, v_mode, v_identifier
        FROM background_job
        WHERE
            id = p_id
            AND (queue = p_queue OR LEFT(queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'));
        IF v_found = 0 THEN
            SET o_outcome = 'missing';
            LEAVE body;
        END IF;

        IF v_group IS NOT NULL THEN
            group_lock: BEGIN
                -- Only this statement turns a lock-wait timeout into 'locked'; nothing is written yet.
                DECLARE EXIT HANDLER FOR 1205 SET o_outcome = 'locked';
                SET SESSION innodb_lock_wait_timeout = 3;
                INSERT INTO background_job_group (serial_group, updated_at) VALUES (v_group, v_now)
                ON DUPLICATE KEY UPDATE updated_at = GREATEST(v_now, updated_at + INTERVAL 1 MICROSECOND);
            END group_lock;
            SET SESSION innodb_lock_wait_timeout = v_old_wait;
            IF o_outcome = 'locked' THEN
                LEAVE body;
            END IF;
        END IF;

        SELECT
            state,
            number_of_attempts,
            coalesce_threshold
        INTO o_state, o_attempt, v_threshold
        FROM background_job
        WHERE id = p_id
        FOR UPDATE;
        IF v_found = 0 THEN
            SET o_outcome = 'missing', o_state = NULL;
            LEAVE body;
        END IF;
        SET o_attempt = NULL;
        SET v_before = o_state;
        IF o_state IN (3, 7) THEN
            SET o_outcome = 'skipped';
            LEAVE body;
        END IF;
        IF NOT o_state IN (-1, 1, 4, 6, 8) THEN
            SET o_outcome = 'unexpected';
            LEAVE body;
        END IF;
        -- A paused queue or group (macros/rules.sql not_paused): nothing changes.
        IF NOT EXISTS (
            SELECT 1 FROM background_job AS j
            WHERE j.id = p_id AND NOT EXISTS (
    SELECT 1 FROM background_job_paused AS pz
    WHERE
        (
            pz.kind = 'queue'
            AND (
                j.queue = pz.name
                OR LEFT(j.queue, CHAR_LENGTH(pz.name) + 1) = CONCAT(pz.name, '_')
            )
        )
        OR (pz.kind = 'group' AND j.serial_group = pz.name)
)
        ) THEN
            SET o_outcome = 'paused';
            LEAVE body;
        END IF;

        IF v_mode = 'unique' AND EXISTS (
            SELECT 1 FROM background_job
            WHERE
                identifier = v_identifier AND id < p_id
                AND (queue = p_queue OR LEFT(queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
        ) THEN
            UPDATE background_job
            SET state = 7, finished_at = v_now, updated_at = v_now
            WHERE id = p_id;
            SET o_outcome = 'redundant', o_state = 7;
        ELSEIF v_group IS NOT NULL THEN
            SET o_predecessor_id = background_job_predecessor(p_id);
            IF o_predecessor_id IS NOT NULL THEN
                UPDATE background_job
                SET
                    state = 6,
                    error_message = CONCAT('Waiting for job ID ', o_predecessor_id),
                    postponed_by = p_waiting_ms,
                    updated_at = v_now
                WHERE id = p_id AND state IN (-1, 1, 4, 6, 8);
                SET o_outcome = 'waiting', o_state = 6;
            END IF;
        END IF;

        IF o_outcome IS NULL THEN
            UPDATE background_job
            SET
                state = 2,
                number_of_attempts = number_of_attempts + 1,
                last_attempt_at = v_now,
                pid = p_pid,
                worker_id = p_worker_id,
                postponed_by = NULL,
                error_message = NULL,
                metadata = p_metadata,
                updated_at = v_now
            WHERE id = p_id AND state IN (-1, 1, 4, 6, 8);
            SELECT number_of_attempts INTO o_attempt
            FROM background_job
            WHERE id = p_id;
            SET o_outcome = 'claimed', o_state = 2;
            IF v_threshold IS NOT NULL AND v_group IS NOT NULL THEN
                UPDATE background_job
                SET state = 7, finished_at = v_now, updated_at = v_now
                WHERE
                    serial_group = v_group
                    AND state IN (-1, 1, 4, 6, 8)
                    AND id <> p_id
                    AND coalesce_threshold >= v_threshold;
            END IF;
        END IF;

        -- A plain claim of a job that was not WAITING changes neither the group's waiting head
        -- nor what may be promoted (the group now runs a job): no wake needed.
        IF
            v_group IS NOT NULL
            AND NOT (o_outcome = 'claimed' AND v_before <> 6 AND v_threshold IS NULL)
        THEN
            CALL background_job_group_wake(v_group, v_now, o_promoted_id);
        END IF;
    END body;

    SET SESSION innodb_lock_wait_timeout = v_old_wait;
END
