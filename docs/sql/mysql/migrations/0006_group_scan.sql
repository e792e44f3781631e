-- bgq migration 0006_group_scan (MySQL 8 / MariaDB 10.11): the claimable grouped jobs in
-- (priority, id) order, and the group heads read from an index
--
-- Changes background_job: one generated column and its index (InnoDB appends the primary key id).
--   grouped_priority   the priority of a grouped job `bgq work` may claim (1, 4, 6, 8), else NULL
--                      (STORED, appended after worker_id as every migrated column is).
--   background_job_grouped (grouped_priority, id)  background_job_claim_batch reads the first few
--                      claimable grouped jobs in (priority, id) order and keeps those that are
--                      their group's head, instead of a GROUP BY over every claimable grouped job.
-- Changes background_job_group: background_job_group_waiting becomes (waiting_head_id,
--   waiting_head_priority); with the primary key serial_group it holds every column
--   background_job_group_heads returns, in its order: an index-only read, no sort.
-- Why: with 100,000 waiting jobs in 5,000 groups the claim took ~300 ms and group_heads ~45 ms
--   (a sort of every group row); tools/head_timing.py.
-- Older workers: tolerated. A generated column and indexes change no written value, and older
--   code never names them (every INSERT names its columns).
-- Cost: adding a STORED generated column rebuilds the jobs table (ALGORITHM=COPY: writes wait
--   while it copies; minutes on millions of rows, so run it in a quiet moment). The group index
--   is rebuilt in place. Every insert and state change maintains them afterwards.
-- MySQL 8 vs MariaDB 10.11: the same statements on both. ADD COLUMN / INDEX IF NOT EXISTS is not
--   used (MySQL 8 rejects it): the checks below stand in.
-- Interrupted: each ALTER TABLE commits on its own, so a run cut short can leave some steps done.
--   Each step first looks in information_schema and is skipped when it is done, so running the
--   migration again completes it.
-- How it runs: `bgq install-procs` creates this procedure, calls it once, drops it and records
--   the row `migration:0006_group_scan` in background_job_meta. By hand, after the CREATE:
--   CALL background_job_migration_0006(); DROP PROCEDURE background_job_migration_0006;
CREATE PROCEDURE background_job_migration_0006()
MODIFIES SQL DATA
BEGIN
    DECLARE v_found INT DEFAULT 0;

    SELECT COUNT(*) INTO v_found
    FROM information_schema.columns
    WHERE
        table_schema = DATABASE()
        AND table_name = 'background_job'
        AND column_name = 'grouped_priority';
    IF v_found = 0 THEN
        ALTER TABLE background_job
            ADD COLUMN grouped_priority INT
            GENERATED ALWAYS AS (
                CASE WHEN serial_group IS NOT NULL AND state IN (1, 4, 6, 8) THEN priority END
            ) STORED;
    END IF;

    SELECT COUNT(*) INTO v_found
    FROM information_schema.statistics
    WHERE
        table_schema = DATABASE()
        AND table_name = 'background_job'
        AND index_name = 'background_job_grouped';
    IF v_found = 0 THEN
        ALTER TABLE background_job
            ADD INDEX background_job_grouped (grouped_priority, id);
    END IF;

    SELECT COUNT(*) INTO v_found
    FROM information_schema.statistics
    WHERE
        table_schema = DATABASE()
        AND table_name = 'background_job_group'
        AND index_name = 'background_job_group_waiting'
        AND column_name = 'waiting_head_priority';
    IF v_found = 0 THEN
        ALTER TABLE background_job_group
            DROP INDEX background_job_group_waiting,
            ADD INDEX background_job_group_waiting (waiting_head_id, waiting_head_priority);
    END IF;
END
