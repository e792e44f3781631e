-- bgq schema, MySQL 8 / MariaDB 10.11.
--
-- {{ table }} is replaced by the configured table name (validated as a plain identifier) by
-- `bgq install-procs`. Seven tables:
--   {{ table }}        the jobs; the source of truth.
--   {{ table }}_group  one row per serial group ever claimed: the group's transactional lock (a
--                      claim or finish locks it FOR UPDATE, so exclusion ends with the transaction)
--                      and the group's WAITING head, kept by the procedures, so the safety net
--                      finds every group's head without scanning waiting jobs.
--   {{ table }}_paused paused queues and groups; {{ table }}_schedule and {{ table }}_fired:
--                      periodic jobs and the fire times that published them (migration 0004).
--   {{ table }}_meta   the installed procedure version and checksum, and one row per applied
--                      migration (migrations/).
--   {{ table }}_worker one row per running `bgq work` / `bgq consume` / `bgq process` process
--                      (bgq/workers.py): registered at its start, heartbeated, removed at a clean
--                      exit; a row whose heartbeat is older than worker_dead_after is a dead
--                      worker, whose PROCESSING jobs {{ table }}_worker_reap takes back.
-- This is the head schema: `bgq install-procs` runs it for a table that does not exist yet and
-- records every migration as applied; an existing table gets the pending migrations in
-- migrations/ instead, never this file. A change here needs its migration (tests/test_migrations.py
-- compares a migrated oldest schema with a fresh install). The jobs table is created last: MySQL
-- commits each CREATE on its own, and install-procs takes an existing jobs table for a finished
-- install, so its bookkeeping tables must already be there.
-- States: -1 BACK_TO_BROKER, 1 READY, 2 PROCESSING, 3 FINISHED, 4 TEMPORARILY_FAILED,
--         5 PERMANENTLY_FAILED, 6 WAITING, 7 REDUNDANT, 8 BROKER_FAILED.
-- Timestamps are UTC (UTC_TIMESTAMP(6)), microsecond precision.
-- Text that names a group, a queue or an identifier compares byte-wise (utf8mb4_bin), as on
-- PostgreSQL. (utf8mb4_bin is PAD SPACE: 'g' and 'g ' are one group here; that only ever
-- over-serialises. MySQL 8 could use utf8mb4_0900_bin, MariaDB utf8mb4_nopad_bin.)

CREATE TABLE IF NOT EXISTS {{ table }}_group (
    serial_group VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
    waiting_head_id BIGINT UNSIGNED NULL,
    waiting_head_priority INT NULL,
    updated_at DATETIME(6) NOT NULL,
    PRIMARY KEY (serial_group),
    -- With the primary key, every column {{ table }}_group_heads returns, in its order
    -- (migration 0006_group_scan).
    KEY {{ table }}_group_waiting (waiting_head_id, waiting_head_priority)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE IF NOT EXISTS {{ table }}_meta (
    name VARCHAR(64) NOT NULL,
    value VARCHAR(255) NOT NULL,
    PRIMARY KEY (name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Workers (migrations/0003_workers.sql). mode: 'work', 'consume' or 'process'. current_job_id is
-- a hint for people (the job's own worker_id is what the reaper reads).
CREATE TABLE IF NOT EXISTS {{ table }}_worker (
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
    KEY {{ table }}_worker_heartbeat (last_heartbeat_at),
    CONSTRAINT {{ table }}_worker_mode_check CHECK (mode IN ('work', 'consume', 'process'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Paused queues and serial groups ({{ table }}_pause / _resume): every claim skips their jobs
-- (the not_paused rule in macros/rules.sql). A handful of rows at most.
CREATE TABLE IF NOT EXISTS {{ table }}_paused (
    kind VARCHAR(8) NOT NULL,
    name VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
    reason TEXT NULL,
    paused_by VARCHAR(255) NULL,
    paused_at DATETIME(6) NOT NULL,
    PRIMARY KEY (kind, name),
    CONSTRAINT {{ table }}_paused_kind_check CHECK (kind IN ('queue', 'group'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Periodic jobs declared in code (bgq/schedules.py), one row per schedule name.
CREATE TABLE IF NOT EXISTS {{ table }}_schedule (
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
    CONSTRAINT {{ table }}_schedule_missed_check CHECK (missed IN ('once', 'skip'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- One row per (schedule, fire time) that published a job: its primary key is what makes a fire
-- time publish exactly one job however many workers race ({{ table }}_fire).
CREATE TABLE IF NOT EXISTS {{ table }}_fired (
    schedule_name VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
    fire_at DATETIME(6) NOT NULL,
    job_id BIGINT UNSIGNED NULL,
    fired_at DATETIME(6) NOT NULL,
    PRIMARY KEY (schedule_name, fire_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE IF NOT EXISTS {{ table }} (
    id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    queue VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
    priority INT NOT NULL,
    callback_name VARCHAR(255) COLLATE utf8mb4_bin NOT NULL,
    parameters LONGBLOB NULL,
    parameters_json JSON NULL,
    state SMALLINT NOT NULL,
    created_at DATETIME(6) NOT NULL,
    last_attempt_at DATETIME(6) NULL,
    number_of_attempts INT NOT NULL DEFAULT 0,
    error_message TEXT NULL,
    serial_group VARCHAR(255) COLLATE utf8mb4_bin NULL,
    coalesce_threshold BIGINT NULL,
    identifier VARCHAR(255) COLLATE utf8mb4_bin NULL,
    postponed_by INT NULL,
    processed_by_broker TINYINT(1) NOT NULL DEFAULT 0,
    execution_time INT NULL,
    finished_at DATETIME(6) NULL,
    pid INT NULL,
    metadata JSON NULL,
    memory JSON NULL,
    mode VARCHAR(16) NOT NULL DEFAULT 'normal',
    updated_at DATETIME(6) NOT NULL,
    -- Set by {{ table }}_cancel on a PROCESSING job: its heartbeat reports the abort.
    abort_requested_at DATETIME(6) NULL,
    -- The group while the job is PROCESSING, else NULL. Its index is not UNIQUE (migration
    -- 0007_running_group_key): InnoDB's duplicate check on a unique secondary index takes gap
    -- locks even at READ COMMITTED, beside entries the purge has not removed yet, so one open
    -- claim made claims of other groups and even publishes wait for it (until a frozen session
    -- was cut; on MySQL 8, which cannot cut it, for hours). One PROCESSING job per group is
    -- kept by the group row lock: every write that makes a grouped job PROCESSING holds it and
    -- re-checks that none is. (PostgreSQL keeps its unique partial index: no gap locks there.)
    running_group VARCHAR(255) COLLATE utf8mb4_bin
    GENERATED ALWAYS AS (CASE WHEN state = 2 THEN serial_group END) STORED,
    -- The group while the job is claimable (-1, 1, 4, 6, 8), else NULL: one index dive on
    -- (pending_group, priority, id) gives a group's head, however many jobs wait in it.
    pending_group VARCHAR(255) COLLATE utf8mb4_bin
    GENERATED ALWAYS AS (CASE WHEN {{ unstarted() }} THEN serial_group END) STORED,
    -- The priority of an ungrouped job `bgq work` may claim (1, 4, 6, 8), else NULL: its index
    -- gives {{ table }}_claim_batch the ungrouped jobs in (priority, id) order.
    ungrouped_priority INT
    GENERATED ALWAYS AS (CASE WHEN serial_group IS NULL AND {{ claimable() }} THEN priority END)
    STORED,
    -- The worker (a worker process's id, NULL when none was given) that claimed the job last:
    -- written by every claim, never cleared (migration 0002_worker_id; appended, as every
    -- migrated column is, so a migrated table has the same column order).
    worker_id BIGINT NULL,
    -- The priority of a grouped job `bgq work` may claim (1, 4, 6, 8), else NULL: its index gives
    -- {{ table }}_claim_batch the first few in (priority, id) order, of which it keeps the
    -- groups' heads (migration 0006_group_scan).
    grouped_priority INT
    GENERATED ALWAYS AS (CASE WHEN serial_group IS NOT NULL AND {{ claimable() }} THEN priority END)
    STORED,
    PRIMARY KEY (id),
    KEY {{ table }}_running_group (running_group),
    KEY {{ table }}_ungrouped (ungrouped_priority, id),
    KEY {{ table }}_pending_head (pending_group, priority, id),
    KEY {{ table }}_group_state (serial_group, state, priority, id),
    KEY {{ table }}_state (state, id),
    KEY {{ table }}_identifier (identifier),
    -- The web console's reads (migration 0005_console): counts per queue and state from the
    -- index alone, the last hour per state by updated_at, one serial group's jobs in id order.
    KEY {{ table }}_queue_state (queue, state),
    KEY {{ table }}_state_updated (state, updated_at),
    KEY {{ table }}_group_id (serial_group),
    -- Migration 0006_group_scan: see grouped_priority.
    KEY {{ table }}_grouped (grouped_priority, id),
    CONSTRAINT {{ table }}_state_check CHECK (state IN (-1, 1, 2, 3, 4, 5, 6, 7, 8)),
    CONSTRAINT {{ table }}_mode_check CHECK (mode IN ('normal', 'unique', 'recurring'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
