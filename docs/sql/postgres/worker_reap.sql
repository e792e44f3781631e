-- bgq background_job_worker_reap, version 2 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_worker_reap(p_queue, p_dead_after_s, p_limit, p_backoff_ms, p_now)
--   p_queue        the base queue (its sub-queues are included), of the jobs and of the workers.
--   p_dead_after_s a worker whose last_heartbeat_at is older than this many seconds is dead.
--   p_limit        at most this many jobs per call.
--   p_backoff_ms   the postponed_by a reaped job gets (>= 0); NULL: backoff(number_of_attempts).
--   p_now          the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: rows (id, queue, priority, pid, stalled_since, state) of the jobs reaped, in id order;
--   stalled_since is the dead worker's last heartbeat, state the job's state now: 4 or 7.
-- Each PROCESSING job whose worker_id names a dead worker becomes TEMPORARILY_FAILED, as
--   background_job_reap does it, with error_message 'Job was stalled in the processing state since
--   <last heartbeat> (PID <pid>); its worker <worker id> stopped heartbeating.' and
--   postponed_by = p_backoff_ms, or when NULL backoff(number_of_attempts); number_of_attempts is
--   not changed and no callback runs. So a SIGKILLed worker's group moves on within
--   worker_dead_after seconds, not stalled_job_timeout. A job whose current attempt was
--   cancelled becomes REDUNDANT instead, as background_job_reap does it (the caller then runs
--   background_job_promote_waiting). Then every dead worker of the queue that no PROCESSING job
--   names any more is deleted from background_job_worker.
-- Reads: the PROCESSING jobs by the background_job_state index (state, id) (few rows), the dead
--   workers by background_job_worker_heartbeat.
-- Locks: each candidate job row, FOR UPDATE OF the job SKIP LOCKED (the worker rows are read,
--   not locked): a row another transaction holds (a frozen worker's finish left open) is
--   skipped, never waited for, and is reaped by a later call. Each dead worker row, FOR UPDATE
--   SKIP LOCKED, before its delete: a worker whose heartbeat transaction is open is skipped.
--   The group is neither locked nor woken, as in background_job_reap.
-- Fencing: each UPDATE is conditional on state = 2 AND number_of_attempts = the claim read AND
--   worker_id = the dead worker, so a finish, a heartbeat's owner or a new claim that got there
--   first wins; a worker row is deleted only while its heartbeat is still older than the bound
--   (re-checked on the locked row) and no PROCESSING job names it.
-- Errors: none. Idempotent: yes.
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION background_job_worker_reap(
    p_queue VARCHAR,
    p_dead_after_s INTEGER,
    p_limit INTEGER,
    p_backoff_ms INTEGER,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    id BIGINT,
    queue VARCHAR,
    priority INTEGER,
    pid INTEGER,
    stalled_since TIMESTAMPTZ,
    state SMALLINT
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP());
    v_cutoff TIMESTAMPTZ := COALESCE(p_now, CLOCK_TIMESTAMP()) - p_dead_after_s * INTERVAL '1 second';
    v_job RECORD;
    v_ids BIGINT[] := '{}';
    v_since TIMESTAMPTZ[] := '{}';
BEGIN
    FOR v_job IN
        SELECT
            j.id, j.number_of_attempts, j.worker_id, w.last_heartbeat_at,
            COALESCE(j.abort_requested_at >= j.last_attempt_at, FALSE) AS cancelled
        FROM background_job AS j
        INNER JOIN background_job_worker AS w ON w.id = j.worker_id
        WHERE j.state = 2
          AND w.last_heartbeat_at < v_cutoff
          AND (j.queue = p_queue OR LEFT(j.queue, LENGTH(p_queue) + 1) = p_queue || '_')
        ORDER BY j.id
        LIMIT p_limit
        FOR UPDATE OF j SKIP LOCKED
    LOOP
        UPDATE background_job AS j
        SET state = CASE WHEN v_job.cancelled THEN 7 ELSE 4 END,
            error_message = CASE WHEN v_job.cancelled THEN j.error_message ELSE
                'Job was stalled in the processing state since '
                || TO_CHAR(v_job.last_heartbeat_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')
                || ' (PID ' || COALESCE(j.pid, 0)
                || '); its worker ' || v_job.worker_id || ' stopped heartbeating.'
            END,
            postponed_by = CASE WHEN v_job.cancelled THEN NULL ELSE COALESCE(
                p_backoff_ms, (LEAST(16, POWER(2, LEAST(j.number_of_attempts, 5) - 1)) * 60000)::INTEGER
            ) END,
            finished_at = CASE WHEN v_job.cancelled THEN v_now ELSE j.finished_at END,
            updated_at = v_now
        WHERE j.id = v_job.id
          AND j.state = 2
          AND j.number_of_attempts = v_job.number_of_attempts
          AND j.worker_id = v_job.worker_id;
        IF FOUND THEN
            v_ids := v_ids || v_job.id;
            v_since := v_since || v_job.last_heartbeat_at;
        END IF;
    END LOOP;

    DELETE FROM background_job_worker AS w
    WHERE w.id IN (
        SELECT d.id
        FROM background_job_worker AS d
        WHERE d.last_heartbeat_at < v_cutoff
          AND (d.queue = p_queue OR LEFT(d.queue, LENGTH(p_queue) + 1) = p_queue || '_')
          AND NOT EXISTS (
              SELECT 1 FROM background_job AS j WHERE j.state = 2 AND j.worker_id = d.id
          )
        FOR UPDATE SKIP LOCKED
    )
    AND w.last_heartbeat_at < v_cutoff;

    RETURN QUERY
    SELECT j.id, j.queue, j.priority, j.pid, r.stalled_since, j.state
    FROM UNNEST(v_ids, v_since) AS r (reaped_id, stalled_since)
    INNER JOIN background_job AS j ON j.id = r.reaped_id
    ORDER BY j.id;
END;
$$;
