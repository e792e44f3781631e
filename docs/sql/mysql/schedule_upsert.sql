-- bgq background_job_schedule_upsert, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_schedule_upsert(p_name, p_cron, p_timezone, p_callback,
--       p_parameters_json, p_queue, p_group, p_priority, p_missed, p_next_at, p_now)
--   p_name             the schedule's name (primary key).
--   p_cron             the cron expression (5 or 6 fields; bgq/schedules.py parses it).
--   p_timezone         the IANA zone it is read in ('UTC', 'Europe/Prague').
--   p_callback, p_parameters_json, p_queue, p_group, p_priority: the job each fire publishes
--                      (validated by the caller as a publish would be).
--   p_missed           'once' (one catch-up job for fires missed while no worker ran) or 'skip'.
--   p_next_at          the first fire time after p_now (computed by the caller from the cron).
--   p_now              the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: one row (created, next_fire_at): created 1 for a new schedule; next_fire_at as stored.
-- What it does: declares the schedule active. An active schedule whose cron and timezone did not
--   change keeps its next_fire_at (so fires missed while no worker ran are seen and follow
--   p_missed); a new, changed or reactivated one starts at p_next_at.
-- Locks: the schedule row. Fencing: none needed (each worker declares the same code).
-- Errors: 31002 / SQLSTATE BQ002 when p_missed is not 'once' or 'skip'.
-- Idempotent: yes. Transaction: never commits.
CREATE PROCEDURE background_job_schedule_upsert(
    IN p_name VARCHAR(255),
    IN p_cron VARCHAR(255),
    IN p_timezone VARCHAR(64),
    IN p_callback VARCHAR(255),
    IN p_parameters_json LONGTEXT,
    IN p_queue VARCHAR(255),
    IN p_group VARCHAR(255),
    IN p_priority INT,
    IN p_missed VARCHAR(8),
    IN p_next_at DATETIME(6),
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_existed INT DEFAULT 0;

    IF p_missed IS NULL OR p_missed NOT IN ('once', 'skip') THEN
        SIGNAL SQLSTATE 'BQ002' SET MYSQL_ERRNO = 31002, MESSAGE_TEXT = 'bgq: missed must be once or skip';
    END IF;
    SELECT COUNT(*) INTO v_existed
    FROM background_job_schedule
    WHERE name = p_name
    FOR UPDATE;
    IF v_existed = 0 THEN
        INSERT INTO background_job_schedule (
            name, cron, timezone, callback_name, parameters_json, queue, serial_group, priority,
            missed, active, next_fire_at, updated_at
        )
        VALUES (
            p_name, p_cron, p_timezone, p_callback, p_parameters_json, p_queue, p_group,
            p_priority, p_missed, 1, p_next_at, v_now
        );
    ELSE
        -- next_fire_at first: the SET list is applied left to right, so it still sees the old
        -- cron, timezone and active.
        UPDATE background_job_schedule
        SET
            next_fire_at = CASE
                WHEN
                    active = 1 AND cron = p_cron AND timezone = p_timezone
                    AND next_fire_at IS NOT NULL
                    THEN next_fire_at
                ELSE p_next_at
            END,
            cron = p_cron,
            timezone = p_timezone,
            callback_name = p_callback,
            parameters_json = p_parameters_json,
            queue = p_queue,
            serial_group = p_group,
            priority = p_priority,
            missed = p_missed,
            active = 1,
            updated_at = v_now
        WHERE name = p_name;
    END IF;

    -- The contract's column order (created, then next_fire_at), as on PostgreSQL, hence the noqa.
    SELECT  -- noqa: ST06
        1 - LEAST(v_existed, 1) AS created,
        next_fire_at
    FROM background_job_schedule
    WHERE name = p_name;
END
