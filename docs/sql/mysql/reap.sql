-- bgq background_job_reap, version 4 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_reap(p_queue, p_timeout_s, p_limit, p_backoff_ms, p_now)
--   p_queue      the base queue (its sub-queues are included).
--   p_timeout_s  a PROCESSING job whose updated_at is older than this many seconds is stalled.
--   p_limit      at most this many jobs per call.
--   p_backoff_ms the postponed_by a reaped job gets (>= 0); NULL: backoff(number_of_attempts).
--   p_now        the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: rows (id, queue, priority, pid, stalled_since, state) of the jobs reaped, in id order;
--   state is the job's state now: 4 (retried) or 7 (cancelled, below).
-- Each stalled job becomes TEMPORARILY_FAILED with error_message 'Job was stalled in the
--   processing state since <updated_at> (PID <pid>); the consumer died without writing a
--   result.' and postponed_by = p_backoff_ms, or when NULL backoff(number_of_attempts) =
--   min(16, 2^(n-1)) minutes in ms;
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
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE background_job_reap(
    IN p_queue VARCHAR(255),
    IN p_timeout_s INT,
    IN p_limit INT,
    IN p_backoff_ms INT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_id BIGINT UNSIGNED;
    DECLARE v_updated DATETIME(6);
    DECLARE v_cancelled INT;
    DECLARE v_ids JSON DEFAULT JSON_ARRAY();
    DECLARE c_stalled CURSOR FOR
        SELECT
            id,
            updated_at,
            COALESCE(abort_requested_at >= last_attempt_at, 0) AS cancelled
        FROM background_job
        WHERE
            state = 2
            AND updated_at < v_now - INTERVAL p_timeout_s SECOND
            AND (queue = p_queue OR LEFT(queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
        ORDER BY id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED; -- noqa: PRS
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;

    OPEN c_stalled;
    stalled_loop: LOOP
        FETCH c_stalled INTO v_id, v_updated, v_cancelled;
        IF v_done = 1 THEN
            LEAVE stalled_loop;
        END IF;
        -- error_message is assigned before updated_at: MySQL assigns left to right.
        UPDATE background_job
        SET
            state = CASE WHEN v_cancelled = 1 THEN 7 ELSE 4 END,
            error_message = CASE WHEN v_cancelled = 1 THEN error_message ELSE CONCAT(
                'Job was stalled in the processing state since ',
                DATE_FORMAT(updated_at, '%Y-%m-%d %H:%i:%s.%f'),
                ' (PID ', COALESCE(pid, 0), '); the consumer died without writing a result.'
            ) END,
            postponed_by = CASE WHEN v_cancelled = 1 THEN NULL ELSE COALESCE(
                p_backoff_ms, CAST(LEAST(16, POW(2, LEAST(number_of_attempts, 5) - 1)) * 60000 AS SIGNED)
            ) END,
            finished_at = CASE WHEN v_cancelled = 1 THEN v_now ELSE finished_at END,
            updated_at = v_now
        WHERE id = v_id AND state = 2 AND updated_at = v_updated;
        IF ROW_COUNT() > 0 THEN
            SET v_ids = JSON_ARRAY_APPEND(v_ids, '$', JSON_OBJECT('id', v_id, 'since', v_updated));
        END IF;
    END LOOP;
    CLOSE c_stalled;

    SELECT
        j.id,
        j.queue,
        j.priority,
        j.pid,
        r.stalled_since,
        j.state
    FROM
        JSON_TABLE(
            v_ids, '$[*]' COLUMNS (
                reaped_id BIGINT UNSIGNED PATH '$.id',
                stalled_since DATETIME(6) PATH '$.since'
            )
        ) AS r
    INNER JOIN background_job AS j ON j.id = r.reaped_id
    ORDER BY j.id;
END
