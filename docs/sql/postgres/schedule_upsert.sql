-- bgq background_job_schedule_upsert, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_schedule_upsert(p_name, p_cron, p_timezone, p_callback,
--       p_parameters_json, p_queue, p_group, p_priority, p_missed, p_next_at, p_now)
--   p_name             the schedule's name (primary key).
--   p_cron             the cron expression (5 or 6 fields; bgq/schedules.py parses it).
--   p_timezone         the IANA zone it is read in ('UTC', 'Europe/Prague').
--   p_callback, p_parameters_json, p_queue, p_group, p_priority: the job each fire publishes
--                      (validated by the caller as a publish would be).
--   p_missed           'once' (one catch-up job for fires missed while no worker ran) or 'skip'.
--   p_next_at          the first fire time after p_now (computed by the caller from the cron).
--   p_now              the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: one row (created, next_fire_at): created 1 for a new schedule; next_fire_at as stored.
-- What it does: declares the schedule active. An active schedule whose cron and timezone did not
--   change keeps its next_fire_at (so fires missed while no worker ran are seen and follow
--   p_missed); a new, changed or reactivated one starts at p_next_at.
-- Locks: the schedule row. Fencing: none needed (each worker declares the same code).
-- Errors: SQLSTATE BQ002 when p_missed is not 'once' or 'skip' (the table's check).
-- Idempotent: yes. Transaction: never commits (a function cannot).
CREATE OR REPLACE FUNCTION background_job_schedule_upsert(
    p_name VARCHAR,
    p_cron VARCHAR,
    p_timezone VARCHAR,
    p_callback VARCHAR,
    p_parameters_json TEXT,
    p_queue VARCHAR,
    p_group VARCHAR,
    p_priority INTEGER,
    p_missed VARCHAR,
    p_next_at TIMESTAMPTZ,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    created INTEGER,
    next_fire_at TIMESTAMPTZ
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_existed INTEGER;
BEGIN
    IF p_missed IS NULL OR p_missed NOT IN ('once', 'skip') THEN
        RAISE EXCEPTION 'bgq: missed must be once or skip' USING ERRCODE = 'BQ002';
    END IF;
    SELECT COUNT(*) INTO v_existed FROM background_job_schedule AS s WHERE s.name = p_name;
    INSERT INTO background_job_schedule AS s (
        name, cron, timezone, callback_name, parameters_json, queue, serial_group, priority,
        missed, active, next_fire_at, updated_at
    )
    VALUES (
        p_name, p_cron, p_timezone, p_callback, p_parameters_json::JSON, p_queue, p_group,
        p_priority, p_missed, 1, p_next_at, v_now
    )
    ON CONFLICT (name) DO UPDATE
    SET next_fire_at = CASE
            WHEN s.active = 1 AND s.cron = EXCLUDED.cron AND s.timezone = EXCLUDED.timezone
                AND s.next_fire_at IS NOT NULL
                THEN s.next_fire_at
            ELSE EXCLUDED.next_fire_at
        END,
        cron = EXCLUDED.cron,
        timezone = EXCLUDED.timezone,
        callback_name = EXCLUDED.callback_name,
        parameters_json = EXCLUDED.parameters_json,
        queue = EXCLUDED.queue,
        serial_group = EXCLUDED.serial_group,
        priority = EXCLUDED.priority,
        missed = EXCLUDED.missed,
        active = 1,
        updated_at = EXCLUDED.updated_at;

    RETURN QUERY
    SELECT 1 - LEAST(v_existed, 1), s.next_fire_at
    FROM background_job_schedule AS s
    WHERE s.name = p_name;
END;
$$;
