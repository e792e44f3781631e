-- bgq migration 0003_workers (MySQL 8 / MariaDB 10.11): the workers table
--
-- Changes: adds the table background_job_worker with its index background_job_worker_heartbeat
--   (last_heartbeat_at); the jobs table is not touched.
-- Why: every `bgq work` / `bgq consume` / `bgq process` process registers a row there
--   (bgq/workers.py) and heartbeats it, so `bgq workers` lists them and
--   background_job_worker_reap takes back a dead worker's PROCESSING jobs within worker_dead_after
--   seconds instead of stalled_job_timeout.
-- Older workers: tolerated. They never name the table: they register no row, and their jobs are
--   reaped by stalled_job_timeout as before.
-- Cost: a new, empty table; nothing is rewritten or locked.
-- MySQL 8 vs MariaDB 10.11: the same statement on both (CREATE TABLE IF NOT EXISTS).
-- Interrupted: the CREATE commits on its own and IF NOT EXISTS skips it on a second run.
-- How it runs: `bgq install-procs` creates this procedure, calls it once, drops it and records
--   the row `migration:0003_workers` in background_job_meta. By hand, after the CREATE:
--   CALL background_job_migration_0003(); DROP PROCEDURE background_job_migration_0003;
CREATE PROCEDURE background_job_migration_0003()
MODIFIES SQL DATA
BEGIN
    CREATE TABLE IF NOT EXISTS background_job_worker (
        id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
        host VARCHAR(255) NOT NULL,
        pid INT NOT NULL,
        mode VARCHAR(16) NOT NULL,
        queue VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
        started_at DATETIME(6) NOT NULL,
        last_heartbeat_at DATETIME(6) NOT NULL,
        current_job_id BIGINT UNSIGNED NULL,
        jobs_done BIGINT NOT NULL DEFAULT 0,
        version VARCHAR(64) NOT NULL,
        PRIMARY KEY (id),
        KEY background_job_worker_heartbeat (last_heartbeat_at),
        CONSTRAINT background_job_worker_mode_check CHECK (mode IN ('work', 'consume', 'process'))
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
END
