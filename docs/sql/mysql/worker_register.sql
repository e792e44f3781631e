-- bgq background_job_worker_register, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_worker_register(p_host, p_pid, p_mode, p_queue, p_version, p_now)
--   p_host     the worker's host name.
--   p_pid      its process id.
--   p_mode     'work', 'consume' or 'process' (the command it runs).
--   p_queue    the queue it takes jobs from.
--   p_version  the bgq version it runs.
--   p_now      the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: exactly one row
--   id  the new worker's id: the claims store it in the jobs' worker_id, and the worker passes
--       it to background_job_worker_heartbeat and background_job_worker_deregister.
-- Inserts one background_job_worker row, started_at = last_heartbeat_at = p_now, jobs_done 0.
-- Locks: the new row only.
-- Fencing: none needed (a new row nobody else knows yet).
-- Errors: a p_mode outside the three violates the table's CHECK (the caller validates first).
-- Idempotent: no (each call registers another worker).
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE background_job_worker_register(
    IN p_host VARCHAR(255),
    IN p_pid INT,
    IN p_mode VARCHAR(16),
    IN p_queue VARCHAR(255),
    IN p_version VARCHAR(64),
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));

    INSERT INTO background_job_worker (
        host, pid, mode, queue, started_at, last_heartbeat_at, current_job_id, jobs_done, version
    )
    VALUES (p_host, p_pid, p_mode, p_queue, v_now, v_now, NULL, 0, p_version);

    SELECT LAST_INSERT_ID() AS id;
END
