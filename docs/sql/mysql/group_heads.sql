-- bgq background_job_group_heads, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_group_heads()
-- Result: rows (serial_group, id, priority), one per serial group that has WAITING jobs: its
--   WAITING job with the lowest priority number, then the lowest id (a gap in the priorities is
--   fine), ordered by id.
-- How: read from background_job_group, whose waiting head background_job_group_wake re-derives in the
--   same transaction as every state change of a grouped job. So the cost grows with the number
--   of groups, never with the number of waiting jobs (no scan of background_job).
-- Fencing: none needed: read-only; every job it names is claimed or promoted by a fenced call.
-- Locks: none (read-only). Errors: none. Idempotent: yes.
CREATE PROCEDURE background_job_group_heads()
READS SQL DATA
BEGIN
    SELECT
        serial_group,
        waiting_head_id AS id,
        waiting_head_priority AS priority
    FROM background_job_group
    WHERE waiting_head_id IS NOT NULL
    ORDER BY waiting_head_id;
END
