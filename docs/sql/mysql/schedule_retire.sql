-- bgq background_job_schedule_retire, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_schedule_retire(p_queue, p_names_json, p_now)
--   p_queue       the base queue: schedules of it and of its sub-queues '<p_queue>_<sub>'.
--   p_names_json  a JSON array of the schedule names the code still declares.
--   p_now         the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: one row (retired): how many schedules were deactivated.
-- What it does: a schedule of the queue that the code no longer declares becomes inactive
--   (active = 0): it fires no more, and `bgq schedules` still shows it (with its last job).
--   Declaring it again reactivates it (background_job_schedule_upsert).
-- Locks: the changed schedule rows. Fencing: none needed. Errors: none. Idempotent: yes.
--   (ROW_COUNT() after this UPDATE counts changed rows: every matched row changes active.)
-- Transaction: never commits.
CREATE PROCEDURE background_job_schedule_retire(
    IN p_queue VARCHAR(255),
    IN p_names_json LONGTEXT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));

    UPDATE background_job_schedule
    SET active = 0, updated_at = v_now
    WHERE
        active = 1
        AND (queue = p_queue OR LEFT(queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
        AND JSON_CONTAINS(COALESCE(p_names_json, '[]'), JSON_QUOTE(name)) = 0;
    SELECT ROW_COUNT() AS retired;
END
