-- bgq migration 0005_console (MySQL 8 / MariaDB 10.11): the indexes of the web console (`bgq web`)
--
-- Changes background_job: three indexes (InnoDB appends the primary key id to each).
--   background_job_queue_state (queue, state)   the overview's counts per queue and state, read
--                                            from the index alone (no pass over the rows);
--   background_job_state_updated (state, updated_at)  the overview's last hour: jobs finished and
--                                            failed per minute, one short range per state;
--   background_job_group_id (serial_group)      the jobs page filtered to one serial group, a
--                                            keyset page in id order however large the group
--                                            (background_job_group_state orders by priority first).
-- Why: without them these reads walk the whole table (at 1,000,000 jobs the overview took
--   3.3 s on MariaDB; tools/web_timing.py).
-- Older workers: tolerated. An index changes no row and no result, and older code never names it.
-- Cost: each index is built in place (ALGORITHM=INPLACE, LOCK=NONE by default): writes go on
--   while it builds. Every insert, state change and heartbeat maintains them afterwards.
-- MySQL 8 vs MariaDB 10.11: the same statements on both. ADD INDEX IF NOT EXISTS is not used
--   (MySQL 8 rejects it): the checks below stand in.
-- Interrupted: each ALTER TABLE commits on its own, so a run cut short can leave some indexes
--   built. Each step first looks in information_schema and is skipped when its index is there,
--   so running the migration again completes it.
-- How it runs: `bgq install-procs` creates this procedure, calls it once, drops it and records
--   the row `migration:0005_console` in background_job_meta. By hand, after the CREATE:
--   CALL background_job_migration_0005(); DROP PROCEDURE background_job_migration_0005;
CREATE PROCEDURE background_job_migration_0005()
MODIFIES SQL DATA
BEGIN
    DECLARE v_found INT DEFAULT 0;

    SELECT COUNT(*) INTO v_found
    FROM information_schema.statistics
    WHERE
        table_schema = DATABASE()
        AND table_name = 'background_job'
        AND index_name = 'background_job_queue_state';
    IF v_found = 0 THEN
        ALTER TABLE background_job
            ADD INDEX background_job_queue_state (queue, state);
    END IF;

    SELECT COUNT(*) INTO v_found
    FROM information_schema.statistics
    WHERE
        table_schema = DATABASE()
        AND table_name = 'background_job'
        AND index_name = 'background_job_state_updated';
    IF v_found = 0 THEN
        ALTER TABLE background_job
            ADD INDEX background_job_state_updated (state, updated_at);
    END IF;

    SELECT COUNT(*) INTO v_found
    FROM information_schema.statistics
    WHERE
        table_schema = DATABASE()
        AND table_name = 'background_job'
        AND index_name = 'background_job_group_id';
    IF v_found = 0 THEN
        ALTER TABLE background_job
            ADD INDEX background_job_group_id (serial_group);
    END IF;
END
