-- bgq background_job_promote_waiting, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_promote_waiting(p_now)
--   p_now  the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: rows (id, queue, priority) of the jobs moved WAITING -> READY, in id order.
-- The safety net (`bgq process`): for every group that has WAITING jobs and no PROCESSING job,
--   background_job_group_wake promotes the group's head if that head is WAITING. At most one job
--   per group per call. Normally the finishing predecessor has already done this; this call
--   catches what a crash between steps left behind.
-- Locks: each candidate group row (FOR UPDATE SKIP LOCKED: a group a worker is claiming or
--   finishing right now is left to that worker), then the promoted job rows.
-- Fencing: promotion is conditional on state = 6. Errors: none. Idempotent: yes.
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
-- MySQL 8 and MariaDB 10.6+ both have SKIP LOCKED and JSON_TABLE.
CREATE PROCEDURE background_job_promote_waiting(IN p_now DATETIME(6))
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_group VARCHAR(255);
    DECLARE v_promoted BIGINT UNSIGNED;
    DECLARE v_ids JSON DEFAULT JSON_ARRAY();
    -- sqlfluff's mysql dialect cannot parse FOR UPDATE after ORDER BY (valid MySQL), hence the noqa.
    DECLARE c_groups CURSOR FOR
        SELECT g.serial_group
        FROM background_job_group AS g
        WHERE
            g.waiting_head_id IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM background_job AS r WHERE r.running_group = g.serial_group)
        ORDER BY g.waiting_head_id
        FOR UPDATE SKIP LOCKED; -- noqa: PRS
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;

    OPEN c_groups;
    groups_loop: LOOP
        FETCH c_groups INTO v_group;
        IF v_done = 1 THEN
            LEAVE groups_loop;
        END IF;
        CALL background_job_group_wake(v_group, v_now, v_promoted);
        SET v_done = 0;
        IF v_promoted IS NOT NULL THEN
            SET v_ids = JSON_ARRAY_APPEND(v_ids, '$', v_promoted);
        END IF;
    END LOOP;
    CLOSE c_groups;

    SELECT
        j.id,
        j.queue,
        j.priority
    FROM JSON_TABLE(v_ids, '$[*]' COLUMNS (promoted_id BIGINT UNSIGNED PATH '$')) AS p
    INNER JOIN background_job AS j ON j.id = p.promoted_id
    ORDER BY j.id;
END
