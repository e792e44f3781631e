-- bgq background_job_worker_heartbeat, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_worker_heartbeat(p_id, p_current_job_id, p_jobs_done, p_now)
--   p_id              the worker (background_job_worker_register's id).
--   p_current_job_id  the job it runs now (NULL: none).
--   p_jobs_done       how many jobs it has run since its start.
--   p_now             the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: exactly one row
--   alive  1 if the worker's row exists (last_heartbeat_at is now p_now); 0 if it does not
--          (deregistered, or removed by background_job_worker_reap as dead): nothing changed, and
--          the worker should register again.
-- Locks: the worker's row only, until the caller commits (a short transaction of its own). The
--   row is read with a locking read first, so `alive` does not depend on CLIENT_FOUND_ROWS.
-- Fencing: a worker found dead and removed is never brought back by a late heartbeat: the
--   UPDATE matches no row. Its jobs were reaped (fenced there on their claim).
-- Errors: none. Idempotent: yes.
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE background_job_worker_heartbeat(
    IN p_id BIGINT UNSIGNED,
    IN p_current_job_id BIGINT UNSIGNED,
    IN p_jobs_done BIGINT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_alive INT DEFAULT 0;

    SELECT COUNT(*) INTO v_alive
    FROM background_job_worker
    WHERE id = p_id
    FOR UPDATE;

    IF v_alive > 0 THEN
        UPDATE background_job_worker
        SET last_heartbeat_at = v_now, current_job_id = p_current_job_id, jobs_done = p_jobs_done
        WHERE id = p_id;
    END IF;

    SELECT v_alive AS alive;
END
