-- bgq background_job_fire, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_fire(p_name, p_fire_at, p_next_at, p_now)
--   p_name     the schedule.
--   p_fire_at  the fire time to publish (a time the cron names, at or before p_now), or NULL to
--              publish nothing (fires skipped by the 'skip' policy) and only move next_fire_at.
--   p_next_at  the schedule's next fire time after this one.
--   p_now      the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: one row (job_id, queue, priority, fired): fired 1 and the new READY job when this call
--   published p_fire_at; 0 and NULLs when another worker had published it already, the schedule
--   is inactive or unknown, or p_fire_at is NULL.
-- Exactly once: the INSERT into background_job_fired, whose primary key is (schedule_name,
--   fire_at), is the deduplication; however many workers on however many hosts race for one
--   fire time, one INSERT succeeds and only that call inserts the job, in the same transaction.
--   next_fire_at only ever moves forward (GREATEST), so a worker with an old read cannot move it
--   back. Rows of background_job_fired older than a day before p_fire_at are deleted as it goes.
-- Locks: the schedule row (FOR UPDATE: racing workers take turns), the new fired row and job.
-- Fencing: the primary key (above); an inactive schedule fires nothing.
-- Errors: none. Idempotent: yes (a repeated call is 'fired 0').
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT; the job and
--   its fired row commit together.
CREATE OR REPLACE FUNCTION background_job_fire(
    p_name VARCHAR,
    p_fire_at TIMESTAMPTZ,
    p_next_at TIMESTAMPTZ,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    job_id BIGINT,
    queue VARCHAR,
    priority INTEGER,
    fired INTEGER
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    s RECORD;
    v_new INTEGER := 0;
    v_job BIGINT;
BEGIN
    SELECT * INTO s FROM background_job_schedule AS x WHERE x.name = p_name AND x.active = 1 FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::BIGINT, NULL::VARCHAR, NULL::INTEGER, 0;
        RETURN;
    END IF;
    IF p_fire_at IS NOT NULL THEN
        INSERT INTO background_job_fired (schedule_name, fire_at, fired_at)
        VALUES (p_name, p_fire_at, v_now)
        ON CONFLICT (schedule_name, fire_at) DO NOTHING;
        GET DIAGNOSTICS v_new = ROW_COUNT;
    END IF;
    IF v_new = 1 THEN
        INSERT INTO background_job (
            queue, priority, callback_name, parameters_json, state, number_of_attempts,
            serial_group, mode, processed_by_broker, created_at, updated_at
        )
        VALUES (
            s.queue, s.priority, s.callback_name, s.parameters_json, 1, 0, s.serial_group,
            'normal', 0, v_now, v_now
        )
        RETURNING id INTO v_job;
        UPDATE background_job_fired AS f SET job_id = v_job
        WHERE f.schedule_name = p_name AND f.fire_at = p_fire_at;
        DELETE FROM background_job_fired AS f
        WHERE f.schedule_name = p_name AND f.fire_at < p_fire_at - INTERVAL '1 day';
    END IF;
    UPDATE background_job_schedule AS x
    SET next_fire_at = GREATEST(COALESCE(x.next_fire_at, p_next_at), p_next_at),
        last_fire_at = CASE WHEN v_new = 1 THEN p_fire_at ELSE x.last_fire_at END,
        last_job_id = CASE WHEN v_new = 1 THEN v_job ELSE x.last_job_id END,
        updated_at = v_now
    WHERE x.name = p_name;

    IF v_new = 1 THEN
        RETURN QUERY SELECT v_job, s.queue, s.priority, 1;
    ELSE
        RETURN QUERY SELECT NULL::BIGINT, NULL::VARCHAR, NULL::INTEGER, 0;
    END IF;
END;
$$;
