-- bgq migration 0004_control (PostgreSQL 15): pause/resume, cancel/abort, schedules
--
-- Changes: adds the column background_job.abort_requested_at and three tables:
--   background_job_paused    paused queues and serial groups (kind, name, reason, paused_by, paused_at);
--   background_job_schedule  periodic jobs declared in code, one row per schedule name;
--   background_job_fired     one row per (schedule, fire time) that published a job: its primary key
--                         makes each fire time publish exactly one job.
-- Why: background_job_cancel marks a running job to abort (its heartbeat reports it); every claim
--   skips the jobs of a paused queue or group (macros/rules.sql not_paused); `bgq work`,
--   `bgq consume` and `bgq process` fire the schedules (background_job_fire).
-- Older workers: tolerated. A nullable column with no default is added in place (no rewrite);
--   older code names its columns and never reads the new ones or the new tables (it does not
--   honour pauses, cancels or schedules until it is upgraded).
-- Cost: ADD COLUMN takes a brief ACCESS EXCLUSIVE lock (catalogue only, no rewrite).
-- Interrupted: install-procs runs the migration and its record in one transaction; IF NOT
--   EXISTS also makes it safe to run again.
ALTER TABLE background_job ADD COLUMN IF NOT EXISTS abort_requested_at TIMESTAMPTZ NULL;

CREATE TABLE IF NOT EXISTS background_job_paused (
    kind VARCHAR(8) NOT NULL,
    name VARCHAR(255) NOT NULL,
    reason TEXT NULL,
    paused_by VARCHAR(255) NULL,
    paused_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (kind, name),
    CONSTRAINT background_job_paused_kind_check CHECK (kind IN ('queue', 'group'))
);

CREATE TABLE IF NOT EXISTS background_job_schedule (
    name VARCHAR(255) NOT NULL PRIMARY KEY,
    cron VARCHAR(255) NOT NULL,
    timezone VARCHAR(64) NOT NULL,
    callback_name VARCHAR(255) NOT NULL,
    parameters_json JSON NULL,
    queue VARCHAR(255) NOT NULL,
    serial_group VARCHAR(255) NULL,
    priority INTEGER NOT NULL,
    missed VARCHAR(8) NOT NULL,
    active SMALLINT NOT NULL,
    next_fire_at TIMESTAMPTZ NULL,
    last_fire_at TIMESTAMPTZ NULL,
    last_job_id BIGINT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    CONSTRAINT background_job_schedule_missed_check CHECK (missed IN ('once', 'skip'))
);

CREATE TABLE IF NOT EXISTS background_job_fired (
    schedule_name VARCHAR(255) NOT NULL,
    fire_at TIMESTAMPTZ NOT NULL,
    job_id BIGINT NULL,
    fired_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (schedule_name, fire_at)
);
