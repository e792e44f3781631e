-- bgq background_job_pause, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_pause(p_kind, p_name, p_reason, p_by, p_now)
--   p_kind    'queue' or 'group'.
--   p_name    the queue (its sub-queues '<p_name>_<sub>' are paused with it) or the serial group.
--   p_reason  why (stored; shown by `bgq monitor`).
--   p_by      who paused it (stored; `bgq pause` passes user@host).
--   p_now     the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: one row (paused): 1 when this call paused it, 0 when it was paused already (the
--   reason and paused_by are replaced, paused_at kept).
-- What it does: a row in background_job_paused. Every claim (claim_batch, due_jobs, claim_job, by
--   the not_paused rule of macros/rules.sql) then skips the queue's or the group's jobs; a
--   running job is not interrupted, and a claim already past its check may still start one job.
-- Locks: the pause row. Fencing: none needed (no job row is written).
-- Errors: 31002 / SQLSTATE BQ002 when p_kind is not 'queue' or 'group' or p_name is empty
--   (nothing written). Idempotent: yes.
-- Transaction: never commits. From a console:
--   START TRANSACTION; CALL background_job_pause('group', 'customer-42', 'migrating', 'dba', NULL); COMMIT;
CREATE PROCEDURE background_job_pause(
    IN p_kind VARCHAR(8),
    IN p_name VARCHAR(255),
    IN p_reason TEXT,
    IN p_by VARCHAR(255),
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_new INT DEFAULT 1;
    DECLARE CONTINUE HANDLER FOR 1062 SET v_new = 0;

    IF p_kind IS NULL OR p_kind NOT IN ('queue', 'group') OR COALESCE(p_name, '') = '' THEN
        SIGNAL SQLSTATE 'BQ002'
            SET MYSQL_ERRNO = 31002, MESSAGE_TEXT = 'bgq: pause kind must be queue or group, with a name';
    END IF;
    INSERT INTO background_job_paused (kind, name, reason, paused_by, paused_at)
    VALUES (p_kind, p_name, p_reason, p_by, v_now);
    IF v_new = 0 THEN
        UPDATE background_job_paused
        SET reason = p_reason, paused_by = p_by
        WHERE kind = p_kind AND name = p_name;
    END IF;
    SELECT v_new AS paused;
END
