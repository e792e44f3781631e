-- bgq migration 0004_control (MySQL 8 / MariaDB 10.11): pause/resume, cancel/abort, schedules
--
-- Changes: adds the column background_job.abort_requested_at (after updated_at, where schema.sql
--   has it) and three tables:
--   background_job_paused    paused queues and serial groups (kind, name, reason, paused_by, paused_at);
--   background_job_schedule  periodic jobs declared in code, one row per schedule name;
--   background_job_fired     one row per (schedule, fire time) that published a job: its primary key
--                         makes each fire time publish exactly one job.
-- Why: background_job_cancel marks a running job to abort (its heartbeat reports it); every claim
--   skips the jobs of a paused queue or group (macros/rules.sql not_paused); `bgq work`,
--   `bgq consume` and `bgq process` fire the schedules (background_job_fire).
-- Older workers: tolerated. bgq's inserts name their columns and its reads take columns by
--   name; older code never reads the new column or tables (it does not honour pauses, cancels
--   or schedules until it is upgraded).
-- Cost: a nullable column without a default is added in place (ALGORITHM=INSTANT on MariaDB
--   10.4+ and MySQL 8.0.29+; older MySQL 8 copies the table, writes wait meanwhile).
-- MySQL 8 vs MariaDB 10.11: the same statements on both (no ADD COLUMN IF NOT EXISTS, which
--   MySQL 8 rejects: the information_schema check stands in).
-- Interrupted: each statement commits on its own; the column step checks information_schema
--   and the tables are CREATE TABLE IF NOT EXISTS, so running the migration again completes it.
-- How it runs: `bgq install-procs` creates this procedure, calls it once, drops it and records
--   the row `migration:0004_control` in background_job_meta.
CREATE PROCEDURE background_job_migration_0004()
MODIFIES SQL DATA
BEGIN
    DECLARE v_found INT DEFAULT 0;

    SELECT COUNT(*) INTO v_found
    FROM information_schema.columns
    WHERE
        table_schema = DATABASE()
        AND table_name = 'background_job'
        AND column_name = 'abort_requested_at';
    IF v_found = 0 THEN
        ALTER TABLE background_job
            ADD COLUMN abort_requested_at DATETIME(6) NULL AFTER updated_at;
    END IF;

    CREATE TABLE IF NOT EXISTS background_job_paused (
        kind VARCHAR(8) NOT NULL,
        name VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
        reason TEXT NULL,
        paused_by VARCHAR(255) NULL,
        paused_at DATETIME(6) NOT NULL,
        PRIMARY KEY (kind, name),
        CONSTRAINT background_job_paused_kind_check CHECK (kind IN ('queue', 'group'))
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

    CREATE TABLE IF NOT EXISTS background_job_schedule (
        name VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
        cron VARCHAR(255) NOT NULL,
        timezone VARCHAR(64) NOT NULL,
        callback_name VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
        parameters_json JSON NULL,
        queue VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
        serial_group VARCHAR(255) COLLATE utf8mb4_bin NULL,
        priority INT NOT NULL,
        missed VARCHAR(8) NOT NULL,
        active SMALLINT NOT NULL,
        next_fire_at DATETIME(6) NULL,
        last_fire_at DATETIME(6) NULL,
        last_job_id BIGINT UNSIGNED NULL,
        updated_at DATETIME(6) NOT NULL,
        PRIMARY KEY (name),
        CONSTRAINT background_job_schedule_missed_check CHECK (missed IN ('once', 'skip'))
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

    CREATE TABLE IF NOT EXISTS background_job_fired (
        schedule_name VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
        fire_at DATETIME(6) NOT NULL,
        job_id BIGINT UNSIGNED NULL,
        fired_at DATETIME(6) NOT NULL,
        PRIMARY KEY (schedule_name, fire_at)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
END
