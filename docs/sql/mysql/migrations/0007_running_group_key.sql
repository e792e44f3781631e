-- bgq migration 0007_running_group_key (MySQL 8 / MariaDB 10.11): the running_group index is no
-- longer UNIQUE
--
-- Changes background_job: background_job_running_group (running_group) becomes a plain index.
-- Why: InnoDB's duplicate check on a UNIQUE secondary index takes next-key (gap) locks even at
--   READ COMMITTED, beside the entries of finished jobs that the purge has not removed yet. So a
--   claim transaction of one group made the claims of *other* groups, and publishes, wait until
--   it ended: for microseconds usually, but for `lock_timeout` when its worker froze (MariaDB then
--   cuts the session) and for up to `wait_timeout` on MySQL 8, which cannot. A plain index takes
--   no such lock. One PROCESSING job per group is kept by the group row lock that every write
--   making a grouped job PROCESSING holds while it re-checks that none is (claim_job, the short
--   ways of claim_batch and hand_off); the chaos harness and the concurrency tests prove it.
-- Older workers: tolerated. No value, column or result changes, and no code names the index's
--   uniqueness (no procedure catches its duplicate-key error).
-- Cost: both steps in one ALTER TABLE, built in place (ALGORITHM=INPLACE, LOCK=NONE): reads and
--   writes go on while the new index is built; on millions of rows that takes a while.
-- MySQL 8 vs MariaDB 10.11: the same statement on both.
-- Interrupted: one ALTER TABLE, so it is done or not; the check below skips it once done.
-- How it runs: `bgq install-procs` creates this procedure, calls it once, drops it and records
--   the row `migration:0007_running_group_key` in background_job_meta. By hand, after the CREATE:
--   CALL background_job_migration_0007(); DROP PROCEDURE background_job_migration_0007;
CREATE PROCEDURE background_job_migration_0007()
MODIFIES SQL DATA
BEGIN
    DECLARE v_found INT DEFAULT 0;

    SELECT COUNT(*) INTO v_found
    FROM information_schema.statistics
    WHERE
        table_schema = DATABASE()
        AND table_name = 'background_job'
        AND index_name = 'background_job_running_group'
        AND non_unique = 0;
    IF v_found > 0 THEN
        ALTER TABLE background_job
            DROP INDEX background_job_running_group,
            ADD INDEX background_job_running_group (running_group),
            ALGORITHM = INPLACE,
            LOCK = NONE;
    END IF;
END
