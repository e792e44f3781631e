-- bgq background_job_schedules, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_schedules(p_queue, p_due_only, p_now)
--   p_queue     the base queue (its sub-queues '<p_queue>_<sub>' are included); NULL: all.
--   p_due_only  1: only active schedules whose next_fire_at <= p_now (the workers' tick);
--               0: every schedule, active or not (`bgq schedules`).
--   p_now       the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: rows ordered by name, of these columns:
--   name, cron, timezone, callback_name, parameters_json, queue, serial_group, priority
--                   the schedule as stored;
--   missed, active, next_fire_at, last_fire_at, last_job_id
--                   as stored (last_*: the last fire time published and its job);
--   last_job_state  the state of that job (NULL when none, or deleted since);
--   now             p_now as the database read it: the fire times are judged by this one clock,
--                   never by a worker host's.
-- Locks: none (read-only). Fencing: none needed. Errors: none. Idempotent: yes.
CREATE PROCEDURE background_job_schedules(
    IN p_queue VARCHAR(255),
    IN p_due_only INT,
    IN p_now DATETIME(6)
)
READS SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));

    SELECT
        s.name,
        s.cron,
        s.timezone,
        s.callback_name,
        s.parameters_json,
        s.queue,
        s.serial_group,
        s.priority,
        s.missed,
        s.active,
        s.next_fire_at,
        s.last_fire_at,
        s.last_job_id,
        j.state AS last_job_state,
        v_now AS now
    FROM background_job_schedule AS s
    LEFT JOIN background_job AS j ON j.id = s.last_job_id
    WHERE
        (p_queue IS NULL OR (s.queue = p_queue OR LEFT(s.queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_')))
        AND (COALESCE(p_due_only, 0) = 0 OR (s.active = 1 AND s.next_fire_at <= v_now))
    ORDER BY s.name;
END
