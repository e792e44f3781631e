-- bgq background_job_pauses, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_pauses()
-- Result: rows (kind, name, reason, paused_by, paused_at) of every paused queue and group,
--   ordered by kind, name (`bgq monitor` and `bgq pause` without arguments show them).
-- Locks: none (read-only). Fencing: none needed. Errors: none. Idempotent: yes.
CREATE PROCEDURE background_job_pauses()
READS SQL DATA
BEGIN
    SELECT
        kind,
        name,
        reason,
        paused_by,
        paused_at
    FROM background_job_paused
    ORDER BY kind, name;
END
