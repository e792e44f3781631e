-- bgq migration 0001_bgq_work (MySQL 8 / MariaDB 10.11): schema version 1 -> 2, what `bgq work` needs
--
-- Changes background_job: adds the STORED generated column ungrouped_priority (placed after
--   pending_group, where schema.sql has it) and the index background_job_ungrouped
--   (ungrouped_priority, id).
-- Why: `bgq work` (background_job_claim_batch) takes the ungrouped claimable jobs (states 1, 4, 6, 8)
--   in (priority, id) order; the column is the job's priority while it is such a job, else NULL,
--   so one range of its index gives them without reading grouped or finished rows.
-- Older workers: tolerated. The column is computed by the server; bgq's inserts name their
--   columns and its reads take columns by name, so version 1 code neither writes nor misses it.
-- Cost: a STORED generated column cannot be added in place: the first step copies the table,
--   and writes to it wait until the copy is done (reads go on). The index is built in place.
-- MySQL 8 vs MariaDB 10.11: the same statements on both. MariaDB's ADD COLUMN IF NOT EXISTS /
--   ADD INDEX IF NOT EXISTS are not used (MySQL 8 rejects them): the checks below stand in.
-- Interrupted: each ALTER TABLE commits on its own, so a run cut short can leave the column
--   without the index. Each step first looks in information_schema and is skipped when its
--   object is there, so running the migration again completes it.
-- How it runs: `bgq install-procs` creates this procedure, calls it once, drops it and records
--   the row `migration:0001_bgq_work` in background_job_meta. By hand, after the CREATE:
--   CALL background_job_migration_0001(); DROP PROCEDURE background_job_migration_0001;
CREATE PROCEDURE background_job_migration_0001()
MODIFIES SQL DATA
BEGIN
    DECLARE v_found INT DEFAULT 0;

    SELECT COUNT(*) INTO v_found
    FROM information_schema.columns
    WHERE
        table_schema = DATABASE()
        AND table_name = 'background_job'
        AND column_name = 'ungrouped_priority';
    IF v_found = 0 THEN
        ALTER TABLE background_job
            ADD COLUMN ungrouped_priority INT
            GENERATED ALWAYS AS (CASE WHEN serial_group IS NULL AND state IN (1, 4, 6, 8) THEN priority END)
            STORED AFTER pending_group;
    END IF;

    SELECT COUNT(*) INTO v_found
    FROM information_schema.statistics
    WHERE
        table_schema = DATABASE()
        AND table_name = 'background_job'
        AND index_name = 'background_job_ungrouped';
    IF v_found = 0 THEN
        ALTER TABLE background_job
            ADD INDEX background_job_ungrouped (ungrouped_priority, id);
    END IF;
END
