-- bgq background_job_group_wake, version 2 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_group_wake(p_group, p_now, @promoted_id)
--   p_group        the serial group.
--   p_now          the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
--   p_promoted_id  OUT: the job promoted WAITING -> READY, or NULL.
--   The one place where WAITING jobs leave for READY. If no job of the group is PROCESSING and
--   the group's first claimable job in (priority, id) order is WAITING, that job becomes READY
--   (error_message and postponed_by cleared). Then the group row's waiting head
--   (waiting_head_id, waiting_head_priority) is re-derived from the jobs (written when it
--   changed). A group with no WAITING job and no recorded waiting head is left alone at once
--   (no lock, no write): there is nothing to promote or refresh. Every procedure that
--   changes a grouped job's state calls it in the same transaction.
--   A group whose head is READY, TEMPORARILY_FAILED, BROKER_FAILED or BACK_TO_BROKER is left as
--   is: that head runs first (so a temporarily failed job wakes nobody).
-- Locks: the group row (background_job_group, upsert = exclusive row lock until the caller's
--   transaction ends), then the promoted job row.
-- Fencing: the promotion is conditional on state = 6; anything else is left untouched.
-- Errors: none. Idempotent: yes (a second call finds a READY head and changes nothing).
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT; under autocommit
--   each statement would commit on its own and the group lock would not hold.
CREATE PROCEDURE background_job_group_wake(
    IN p_group VARCHAR(255),
    IN p_now DATETIME(6),
    OUT p_promoted_id BIGINT UNSIGNED
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_running BIGINT UNSIGNED DEFAULT NULL;
    DECLARE v_head BIGINT UNSIGNED DEFAULT NULL;
    DECLARE v_head_state SMALLINT DEFAULT NULL;
    DECLARE v_wait_id BIGINT UNSIGNED DEFAULT NULL;
    DECLARE v_wait_priority INT DEFAULT NULL;
    DECLARE v_waiting INT DEFAULT 0;
    DECLARE v_recorded INT DEFAULT 0;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;

    SET p_promoted_id = NULL;
    -- Only a group with a WAITING job, or a waiting head still recorded, has anything to
    -- promote or refresh; for any other group this procedure neither locks nor writes.
    -- (SELECT ... INTO is a plain read; IF EXISTS (SELECT ...) would be a locking one.)
    SELECT COUNT(*) INTO v_waiting
    FROM background_job
    WHERE serial_group = p_group AND state = 6;
    SELECT COUNT(*) INTO v_recorded
    FROM background_job_group
    WHERE serial_group = p_group AND waiting_head_id IS NOT NULL;
    IF v_waiting > 0 OR v_recorded > 0 THEN
        INSERT INTO background_job_group (serial_group, updated_at) VALUES (p_group, v_now)
        ON DUPLICATE KEY UPDATE updated_at = v_now;

        SELECT id INTO v_running
        FROM background_job
        WHERE running_group = p_group
        FOR UPDATE;
        IF v_running IS NULL THEN
            -- sqlfluff's mysql dialect cannot parse FOR UPDATE after LIMIT (valid MySQL), hence the noqa.
            SELECT
                id,
                state
            INTO v_head, v_head_state
            FROM background_job
            WHERE pending_group = p_group
            ORDER BY priority, id
            LIMIT 1
            FOR UPDATE; -- noqa: PRS
            IF v_head_state = 6 THEN
                UPDATE background_job
                SET state = 1, error_message = NULL, postponed_by = NULL, updated_at = v_now
                WHERE id = v_head AND state = 6;
                SET p_promoted_id = v_head;
            END IF;
        END IF;

        -- sqlfluff's mysql dialect cannot parse FOR UPDATE after LIMIT (valid MySQL), hence the noqa.
        SELECT
            id,
            priority
        INTO v_wait_id, v_wait_priority
        FROM background_job
        WHERE serial_group = p_group AND state = 6
        ORDER BY priority, id
        LIMIT 1
        FOR UPDATE; -- noqa: PRS
        UPDATE background_job_group
        SET waiting_head_id = v_wait_id, waiting_head_priority = v_wait_priority, updated_at = v_now
        WHERE
            serial_group = p_group
            AND NOT (waiting_head_id <=> v_wait_id AND waiting_head_priority <=> v_wait_priority);
    END IF;
END
