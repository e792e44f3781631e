-- bgq migration 0002_worker_id (MySQL 8 / MariaDB 10.11): the worker that claimed a job
--
-- Changes background_job: adds the column worker_id BIGINT NULL, last in the table (after the
--   generated columns, where schema.sql has it).
-- Why: every claim (background_job_claim, background_job_claim_batch, background_job_hand_off, through
--   background_job_claim_job) stores its p_worker_id there, so a worker known to be dead can have
--   its PROCESSING jobs given back at once instead of after stalled_job_timeout. NULL: the
--   claim named no worker (older workers, a DBA's claim).
-- Older workers: tolerated. bgq's inserts name their columns and its reads take columns by name;
--   older claim procedures leave the column NULL.
-- Cost: a nullable column added last is an instant change in MariaDB 10.3+ and MySQL 8.0.12+
--   (metadata only, no table copy).
-- MySQL 8 vs MariaDB 10.11: the same statements on both. ADD COLUMN IF NOT EXISTS is MariaDB
--   only, so the check below stands in.
-- Interrupted: one ALTER TABLE, which commits on its own; the step first looks in
--   information_schema and is skipped when the column is there, so running it again is safe.
-- How it runs: `bgq install-procs` creates this procedure, calls it once, drops it and records
--   the row `migration:0002_worker_id` in background_job_meta. By hand, after the CREATE:
--   CALL background_job_migration_0002(); DROP PROCEDURE background_job_migration_0002;
CREATE PROCEDURE background_job_migration_0002()
MODIFIES SQL DATA
BEGIN
    DECLARE v_found INT DEFAULT 0;

    SELECT COUNT(*) INTO v_found
    FROM information_schema.columns
    WHERE
        table_schema = DATABASE()
        AND table_name = 'background_job'
        AND column_name = 'worker_id';
    IF v_found = 0 THEN
        ALTER TABLE background_job
            ADD COLUMN worker_id BIGINT NULL;
    END IF;
END
