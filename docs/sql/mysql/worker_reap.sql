-- bgq background_job_worker_reap, version 2 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_worker_reap(p_queue, p_dead_after_s, p_limit, p_backoff_ms, p_now)
--   p_queue        the base queue (its sub-queues are included), of the jobs and of the workers.
--   p_dead_after_s a worker whose last_heartbeat_at is older than this many seconds is dead.
--   p_limit        at most this many jobs per call.
--   p_backoff_ms   the postponed_by a reaped job gets (>= 0); NULL: backoff(number_of_attempts).
--   p_now          the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
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
-- Locks: each candidate job row and its worker row, FOR UPDATE SKIP LOCKED (MariaDB has no
--   FOR UPDATE OF): a row another transaction holds (a frozen worker's finish or heartbeat left
--   open) is skipped, never waited for, and is reaped by a later call. Each dead worker row,
--   FOR UPDATE SKIP LOCKED, before its delete. The group is neither locked nor woken, as in
--   background_job_reap.
-- Fencing: each UPDATE is conditional on state = 2 AND number_of_attempts = the claim read AND
--   worker_id = the dead worker, so a finish or a new claim that got there first wins; a worker
--   row is deleted only while its heartbeat is still older than the bound and no PROCESSING job
--   names it.
-- Errors: none. Idempotent: yes.
-- MySQL 8: SKIP LOCKED needs 8.0.1+ (MariaDB 10.6+); the cursors' rows are locked at OPEN.
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE background_job_worker_reap(
    IN p_queue VARCHAR(255),
    IN p_dead_after_s INT,
    IN p_limit INT,
    IN p_backoff_ms INT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_cutoff DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6)) - INTERVAL p_dead_after_s SECOND;
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_id BIGINT UNSIGNED;
    DECLARE v_attempts INT;
    DECLARE v_worker BIGINT UNSIGNED;
    DECLARE v_beat DATETIME(6);
    DECLARE v_cancelled INT;
    DECLARE v_busy INT DEFAULT 0;
    DECLARE v_ids JSON DEFAULT JSON_ARRAY();
    DECLARE c_jobs CURSOR FOR
        SELECT
            j.id,
            j.number_of_attempts,
            j.worker_id,
            w.last_heartbeat_at,
            COALESCE(j.abort_requested_at >= j.last_attempt_at, 0) AS cancelled
        FROM background_job AS j
        INNER JOIN background_job_worker AS w ON w.id = j.worker_id
        WHERE
            j.state = 2
            AND w.last_heartbeat_at < v_cutoff
            AND (j.queue = p_queue OR LEFT(j.queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
        ORDER BY j.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED; -- noqa: PRS
    DECLARE c_dead CURSOR FOR
        SELECT d.id
        FROM background_job_worker AS d
        WHERE
            d.last_heartbeat_at < v_cutoff
            AND (d.queue = p_queue OR LEFT(d.queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
        ORDER BY d.id
        FOR UPDATE SKIP LOCKED; -- noqa: PRS
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;

    OPEN c_jobs;
    jobs_loop: LOOP
        FETCH c_jobs INTO v_id, v_attempts, v_worker, v_beat, v_cancelled;
        IF v_done = 1 THEN
            LEAVE jobs_loop;
        END IF;
        UPDATE background_job
        SET
            state = CASE WHEN v_cancelled = 1 THEN 7 ELSE 4 END,
            error_message = CASE WHEN v_cancelled = 1 THEN error_message ELSE CONCAT(
                'Job was stalled in the processing state since ',
                DATE_FORMAT(v_beat, '%Y-%m-%d %H:%i:%s.%f'),
                ' (PID ', COALESCE(pid, 0), '); its worker ', v_worker, ' stopped heartbeating.'
            ) END,
            postponed_by = CASE WHEN v_cancelled = 1 THEN NULL ELSE COALESCE(
                p_backoff_ms, CAST(LEAST(16, POW(2, LEAST(number_of_attempts, 5) - 1)) * 60000 AS SIGNED)
            ) END,
            finished_at = CASE WHEN v_cancelled = 1 THEN v_now ELSE finished_at END,
            updated_at = v_now
        WHERE id = v_id AND state = 2 AND number_of_attempts = v_attempts AND worker_id = v_worker;
        IF ROW_COUNT() > 0 THEN
            SET v_ids = JSON_ARRAY_APPEND(v_ids, '$', JSON_OBJECT('id', v_id, 'since', v_beat));
        END IF;
    END LOOP;
    CLOSE c_jobs;

    SET v_done = 0;
    OPEN c_dead;
    dead_loop: LOOP
        FETCH c_dead INTO v_worker;
        IF v_done = 1 THEN
            LEAVE dead_loop;
        END IF;
        SELECT COUNT(*) INTO v_busy
        FROM background_job
        WHERE state = 2 AND worker_id = v_worker;
        IF v_busy = 0 THEN
            DELETE FROM background_job_worker
            WHERE id = v_worker AND last_heartbeat_at < v_cutoff;
        END IF;
    END LOOP;
    CLOSE c_dead;

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
