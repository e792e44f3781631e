-- bgq background_job_reap, version 4 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_reap(p_queue, p_timeout_s, p_limit, p_backoff_ms, p_now)
--   p_queue      the base queue (its sub-queues are included).
--   p_timeout_s  a PROCESSING job whose updated_at is older than this many seconds is stalled.
--   p_limit      at most this many jobs per call.
--   p_backoff_ms the postponed_by a reaped job gets (>= 0); NULL: backoff(number_of_attempts).
--   p_now        the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: rows (id, queue, priority, pid, stalled_since, state) of the jobs reaped, in id order;
--   state is the job's state now: 4 (retried) or 7 (cancelled, below).
-- Each stalled job becomes TEMPORARILY_FAILED with error_message 'Job was stalled in the
--   processing state since <updated_at> (PID <pid>); the consumer died without writing a
--   result.' (<updated_at> in UTC, YYYY-MM-DD HH:MM:SS.ffffff, as on MySQL) and
--   postponed_by = p_backoff_ms, or when NULL backoff(number_of_attempts) = min(16, 2^(n-1))
--   minutes in ms;
--   number_of_attempts is not changed and no callback runs. Liveness is judged by updated_at
--   (claim and heartbeats), never by pid.
-- A stalled job whose current attempt background_job_cancel asked to stop (abort_requested_at >=
--   last_attempt_at) is not retried: it becomes REDUNDANT (finished_at = p_now, postponed_by
--   NULL), keeping its error_message 'Cancelled: <reason>', as its worker would have written it.
--   Its group is not woken here (see Locks): the caller runs background_job_promote_waiting after
--   the commit, so a WAITING successor (broker mode) is promoted; in the other modes the next
--   job of the group is claimable at once.
-- Locks: each stalled candidate row, FOR UPDATE SKIP LOCKED: a row another transaction holds
--   (a frozen worker's heartbeat or finish left open) is skipped, never waited for, and is reaped
--   by a later call once the lock is gone; so the reaper never waits for a lock. Its group is
--   neither locked nor woken (taking the group row after the job row would invert the claim's
--   lock order): a reaped job is claimable, so it usually stays first in its group; if a
--   better-priority job of the group is WAITING, cron mode retries it and broker mode's safety
--   net (background_job_promote_waiting, run by `bgq process` right after the reaper) promotes it.
-- Fencing: each UPDATE is conditional on state = 2 AND updated_at = the value read, so a
--   heartbeat, a finish or another reaper that got there first wins.
-- Errors: none. Idempotent: yes.
-- MySQL 8: SKIP LOCKED needs 8.0.1+ (MariaDB 10.6+); the cursor's rows are locked at OPEN.
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION background_job_reap(
    p_queue VARCHAR,
    p_timeout_s INTEGER,
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
    v_stalled RECORD;
    v_ids BIGINT[] := '{}';
    v_since TIMESTAMPTZ[] := '{}';
BEGIN
    FOR v_stalled IN
        SELECT j.id, j.updated_at, COALESCE(j.abort_requested_at >= j.last_attempt_at, FALSE) AS cancelled
        FROM background_job AS j
        WHERE j.state = 2
          AND j.updated_at < v_now - p_timeout_s * INTERVAL '1 second'
          AND (j.queue = p_queue OR LEFT(j.queue, LENGTH(p_queue) + 1) = p_queue || '_')
        ORDER BY j.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    LOOP
        -- Every expression of SET reads the row as it was before the UPDATE.
        -- The backoff exponent is capped at 5 (2^4 = 16 already): same values, no overflow.
        UPDATE background_job AS j
        SET state = CASE WHEN v_stalled.cancelled THEN 7 ELSE 4 END,
            error_message = CASE WHEN v_stalled.cancelled THEN j.error_message ELSE
                'Job was stalled in the processing state since '
                || TO_CHAR(j.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')
                || ' (PID ' || COALESCE(j.pid, 0)
                || '); the consumer died without writing a result.'
            END,
            postponed_by = CASE WHEN v_stalled.cancelled THEN NULL ELSE COALESCE(
                p_backoff_ms, (LEAST(16, POWER(2, LEAST(j.number_of_attempts, 5) - 1)) * 60000)::INTEGER
            ) END,
            finished_at = CASE WHEN v_stalled.cancelled THEN v_now ELSE j.finished_at END,
            updated_at = v_now
        WHERE j.id = v_stalled.id AND j.state = 2 AND j.updated_at = v_stalled.updated_at;
        IF FOUND THEN
            v_ids := v_ids || v_stalled.id;
            v_since := v_since || v_stalled.updated_at;
        END IF;
    END LOOP;

    RETURN QUERY
    SELECT j.id, j.queue, j.priority, j.pid, r.stalled_since, j.state
    FROM UNNEST(v_ids, v_since) AS r (reaped_id, stalled_since)
    INNER JOIN background_job AS j ON j.id = r.reaped_id
    ORDER BY j.id;
END;
$$;
