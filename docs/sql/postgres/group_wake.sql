-- bgq background_job_group_wake, version 2 (PostgreSQL 15)
--
-- Contract
--   SELECT background_job_group_wake(p_group, p_now) -> BIGINT or NULL
--   p_group  the serial group.
--   p_now    the clock (TIMESTAMPTZ); NULL means clock_timestamp().
--   Returns the job promoted WAITING -> READY, or NULL (MySQL's OUT p_promoted_id).
--   The one place where WAITING jobs leave for READY. If no job of the group is PROCESSING and
--   the group's first claimable job in (priority, id) order is WAITING, that job becomes READY
--   (error_message and postponed_by cleared). Then the group row's waiting head
--   (waiting_head_id, waiting_head_priority) is re-derived from the jobs (written when it
--   changed). A group with no WAITING job and no recorded waiting head is left alone at once
--   (no lock, no write): there is nothing to promote or refresh. Every function that
--   changes a grouped job's state calls it in the same transaction.
--   A group whose head is READY, TEMPORARILY_FAILED, BROKER_FAILED or BACK_TO_BROKER is left as
--   is: that head runs first (so a temporarily failed job wakes nobody).
-- Locks: the group row (background_job_group, upsert = exclusive row lock until the caller's
--   transaction ends), then the promoted job row. The reads after the lock are plain reads:
--   at READ COMMITTED each statement sees the latest committed rows.
-- Fencing: the promotion is conditional on state = 6; anything else is left untouched (and
--   then nothing is reported as promoted).
-- Errors: none. Idempotent: yes (a second call finds a READY head and changes nothing).
-- Transaction: never commits (a function cannot). Call it at READ COMMITTED; its locks last
--   until the end of the caller's transaction (a lone SELECT is a transaction of its own).
CREATE OR REPLACE FUNCTION background_job_group_wake(
    p_group VARCHAR,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS BIGINT
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_running BIGINT;
    v_head BIGINT;
    v_head_state SMALLINT;
    v_wait_id BIGINT;
    v_wait_priority INTEGER;
    v_promoted BIGINT;
BEGIN
    -- Only a group with a WAITING job, or a waiting head still recorded, has anything to
    -- promote or refresh; for any other group this function neither locks nor writes.
    IF NOT EXISTS (SELECT 1 FROM background_job AS j WHERE j.serial_group = p_group AND j.state = 6)
        AND NOT EXISTS (
            SELECT 1 FROM background_job_group AS g
            WHERE g.serial_group = p_group AND g.waiting_head_id IS NOT NULL
        ) THEN
        RETURN NULL;
    END IF;

    INSERT INTO background_job_group (serial_group, updated_at) VALUES (p_group, v_now)
    ON CONFLICT (serial_group) DO UPDATE SET updated_at = EXCLUDED.updated_at;

    SELECT j.id INTO v_running
    FROM background_job AS j
    WHERE j.serial_group = p_group AND j.state = 2;
    IF v_running IS NULL THEN
        SELECT j.id, j.state INTO v_head, v_head_state
        FROM background_job AS j
        WHERE j.serial_group = p_group AND j.state IN (-1, 1, 4, 6, 8)
        ORDER BY j.priority, j.id
        LIMIT 1;
        IF v_head_state = 6 THEN
            UPDATE background_job AS j
            SET state = 1, error_message = NULL, postponed_by = NULL, updated_at = v_now
            WHERE j.id = v_head AND j.state = 6;
            IF FOUND THEN
                v_promoted := v_head;
            END IF;
        END IF;
    END IF;

    SELECT j.id, j.priority INTO v_wait_id, v_wait_priority
    FROM background_job AS j
    WHERE j.serial_group = p_group AND j.state = 6
    ORDER BY j.priority, j.id
    LIMIT 1;
    UPDATE background_job_group AS g
    SET waiting_head_id = v_wait_id, waiting_head_priority = v_wait_priority, updated_at = v_now
    WHERE
        g.serial_group = p_group
        AND (
            g.waiting_head_id IS DISTINCT FROM v_wait_id
            OR g.waiting_head_priority IS DISTINCT FROM v_wait_priority
        );

    RETURN v_promoted;
END;
$$;
