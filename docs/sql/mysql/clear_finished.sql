-- bgq background_job_clear_finished, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_clear_finished(p_queue, p_before, p_now)
--   p_queue   the base queue (its sub-queues '<p_queue>_<sub>' are included).
--   p_before  delete only jobs with created_at <= p_before; NULL: every finished job created up
--             to p_now (`bgq clear-finished N` passes today 00:00 UTC minus N days).
--   p_now     the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: exactly one row
--   deleted  the number of job rows deleted.
-- Deletes the queue's FINISHED (3) jobs, and only those: REDUNDANT, PERMANENTLY_FAILED and every
--   other state stay. Then deletes the rows of background_job_group (any queue: a group row has
--   none) whose group has no unfinished job any more (none PROCESSING, none claimable: -1, 1,
--   4, 6, 8). A claim or a finish upserts its group row, so a deleted row is recreated whenever
--   the group is used again.
-- Locks: the deleted job rows; then each candidate group row, FOR UPDATE SKIP LOCKED: a group
--   row another transaction holds (a claim, a finish) is in use and is skipped, so this never
--   waits for a group and never deadlocks with a claim (which locks the group row first).
-- Fencing: a group row is deleted only after it is locked, by a statement that re-checks that
--   its group has no PROCESSING or claimable job: every procedure that makes a grouped job
--   WAITING or PROCESSING holds the group row, so that check cannot miss one. A job published
--   into the group later recreates the row at its claim.
-- Index: background_job_state (state, id); background_job_running_group and background_job_pending_head
--   for the group check. Errors: none. Idempotent: yes (a second call deletes 0).
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE background_job_clear_finished(
    IN p_queue VARCHAR(255),
    IN p_before DATETIME(6),
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_deleted INT DEFAULT 0;
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_group VARCHAR(255) COLLATE utf8mb4_bin DEFAULT NULL;
    DECLARE v_locked VARCHAR(255) COLLATE utf8mb4_bin DEFAULT NULL;
    -- The candidate group rows (opened after the jobs are deleted); each is locked and checked
    -- again in the loop.
    DECLARE c_groups CURSOR FOR
        SELECT g.serial_group
        FROM background_job_group AS g
        WHERE
            NOT EXISTS (SELECT 1 FROM background_job AS r WHERE r.running_group = g.serial_group)
            AND NOT EXISTS (
                SELECT 1 FROM background_job AS p
                WHERE p.pending_group = g.serial_group
            )
        ORDER BY g.serial_group;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;

    DELETE FROM background_job
    WHERE
        state = 3
        AND created_at <= COALESCE(p_before, v_now)
        AND (queue = p_queue OR LEFT(queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'));
    SET v_deleted = ROW_COUNT();

    OPEN c_groups;
    groups_loop: LOOP
        FETCH c_groups INTO v_group;
        IF v_done = 1 THEN
            LEAVE groups_loop;
        END IF;
        SET v_locked = NULL;
        -- SKIP LOCKED: MySQL 8 and MariaDB 10.6+.
        SELECT serial_group INTO v_locked
        FROM background_job_group
        WHERE serial_group = v_group
        FOR UPDATE SKIP LOCKED;
        SET v_done = 0; -- a skipped (locked) group row raised NOT FOUND above
        IF v_locked IS NOT NULL THEN
            DELETE FROM background_job_group
            WHERE
                serial_group = v_group
                AND NOT EXISTS (SELECT 1 FROM background_job AS r WHERE r.running_group = v_group)
                AND NOT EXISTS (
                    SELECT 1 FROM background_job
                    WHERE pending_group = v_group
                );
        END IF;
    END LOOP;
    CLOSE c_groups;

    SELECT v_deleted AS deleted;
END
