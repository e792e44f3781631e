-- bgq background_job_worker_deregister, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_worker_deregister(p_id)
--   p_id  the worker (background_job_worker_register's id), at its clean exit.
-- Result: exactly one row
--   removed  1 if the row was there and is deleted; 0 if it was not (already reaped as dead).
-- Jobs are not touched: a clean exit has written or given back its jobs already.
-- Locks: the worker's row only, until the caller commits.
-- Fencing: none needed (only the worker itself calls it with its id).
-- Errors: none. Idempotent: yes.
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE background_job_worker_deregister(
    IN p_id BIGINT UNSIGNED
)
MODIFIES SQL DATA
BEGIN
    DELETE FROM background_job_worker
    WHERE id = p_id;

    SELECT ROW_COUNT() AS removed;
END
