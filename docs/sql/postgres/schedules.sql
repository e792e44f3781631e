-- bgq background_job_schedules, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_schedules(p_queue, p_due_only, p_now)
--   p_queue     the base queue (its sub-queues '<p_queue>_<sub>' are included); NULL: all.
--   p_due_only  1: only active schedules whose next_fire_at <= p_now (the workers' tick);
--               0: every schedule, active or not (`bgq schedules`).
--   p_now       the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: rows ordered by name, of these columns:
--   name, cron, timezone, callback_name, parameters_json, queue, serial_group, priority
--                   the schedule as stored;
--   missed, active, next_fire_at, last_fire_at, last_job_id
--                   as stored (last_*: the last fire time published and its job);
--   last_job_state  the state of that job (NULL when none, or deleted since);
--   now             p_now as the database read it: the fire times are judged by this one clock,
--                   never by a worker host's.
-- Locks: none (read-only). Fencing: none needed. Errors: none. Idempotent: yes.
CREATE OR REPLACE FUNCTION background_job_schedules(
    p_queue VARCHAR,
    p_due_only INTEGER,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    name VARCHAR,
    cron VARCHAR,
    timezone VARCHAR,
    callback_name VARCHAR,
    parameters_json JSON,
    queue VARCHAR,
    serial_group VARCHAR,
    priority INTEGER,
    missed VARCHAR,
    active SMALLINT,
    next_fire_at TIMESTAMPTZ,
    last_fire_at TIMESTAMPTZ,
    last_job_id BIGINT,
    last_job_state SMALLINT,
    now TIMESTAMPTZ
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
BEGIN
    RETURN QUERY
    SELECT
        s.name, s.cron, s.timezone, s.callback_name, s.parameters_json, s.queue, s.serial_group,
        s.priority, s.missed, s.active, s.next_fire_at, s.last_fire_at, s.last_job_id, j.state,
        v_now
    FROM background_job_schedule AS s
    LEFT JOIN background_job AS j ON j.id = s.last_job_id
    WHERE
        (p_queue IS NULL OR (s.queue = p_queue OR LEFT(s.queue, LENGTH(p_queue) + 1) = p_queue || '_'))
        AND (COALESCE(p_due_only, 0) = 0 OR (s.active = 1 AND s.next_fire_at <= v_now))
    ORDER BY s.name;
END;
$$;
