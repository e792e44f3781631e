-- bgq {{ table }}_claim, version 4 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM {{ table }}_claim(p_id, p_queue, p_pid, p_waiting_ms, p_metadata, p_worker_id,
--                                   p_now)
--   p_id          the job to claim.
--   p_queue       the base queue: the job must be in it or in a sub-queue '<p_queue>_<sub>'.
--   p_pid         the worker's process id (stored for people, never used for liveness).
--   p_waiting_ms  postponed_by written when the job has to wait (waiting_job_expiration).
--   p_metadata    JSON text stored in metadata on a successful claim (NULL stores NULL).
--   p_worker_id   stored in worker_id on a successful claim: the claiming worker (NULL: none).
--   p_now         the clock (TIMESTAMPTZ); NULL means clock_timestamp().
-- Result: exactly one row
--   outcome         'claimed'    the job is PROCESSING and belongs to the caller;
--                   'waiting'    a predecessor exists: the job is WAITING (conditional write);
--                   'redundant'  UNIQUE job with an older row of its identifier: REDUNDANT;
--                   'locked'     the group row stayed locked for {{ group_lock_wait_s }} s: nothing changed;
--                   'paused'     its queue or group is paused ({{ table }}_pause): nothing changed;
--                   'missing'    no such job in this queue;
--                   'skipped'    FINISHED or REDUNDANT already (an expected duplicate);
--                   'unexpected' PROCESSING or PERMANENTLY_FAILED: nothing changed.
--   attempt         number_of_attempts after the claim: the fencing token that
--                   {{ table }}_finish must present. NULL unless claimed.
--   state           the job's state after the call (NULL when missing).
--   predecessor_id  the job it waits for ('waiting').
--   promoted_id     a job of the group this call moved WAITING -> READY (publish it).
--   callback_name, parameters_json, parameters, queue, priority, serial_group, identifier,
--   mode, coalesce_threshold: the job as stored (NULL when missing).
-- Steps ({{ table }}_claim_job does them; this function adds the job's columns): a claimable
--   state is -1, 1, 4, 6, 8. A grouped job first locks its group row; then the job is re-read
--   under the lock; a UNIQUE duplicate turns REDUNDANT; a job with a predecessor
--   ({{ table }}_predecessor) turns WAITING; otherwise it is claimed (PROCESSING, attempts + 1,
--   last_attempt_at, pid, metadata, worker_id; postponed_by and error_message cleared) and, with a
--   coalesce_threshold, swallows the unstarted jobs of its group whose threshold is >= its own
--   (REDUNDANT). {{ table }}_group_wake then refreshes the group row.
-- Locks: the group row (waits at most {{ group_lock_wait_s }} s: {{ table }}_claim_job is declared
--   SET lock_timeout = '{{ group_lock_wait_s }}s', which PostgreSQL restores when the function
--   returns, also on error; lock_not_available, SQLSTATE 55P03, on that one statement is caught in
--   a subtransaction and becomes 'locked'), then the job row (FOR UPDATE). The other reads are
--   plain reads: at READ COMMITTED each statement sees the latest committed rows. The
--   {{ group_lock_wait_s }} s bound covers every lock wait inside the function: a longer wait
--   elsewhere (the job row of an ungrouped job that another transaction holds) raises SQLSTATE
--   55P03, which the caller may retry.
-- Fencing: every write is conditional on a claimable state; a job claimed elsewhere first is
--   'unexpected' or 'skipped' here and nothing is written.
-- Errors: none of its own. Idempotent: a second call on a claimed job is 'unexpected'.
-- Group row: every claim of a group's job writes the group's row (the MySQL twin's rule, for
--   Galera, where a row lock holds on one node only); here the row is locked or upserted as
--   before: version 4 changes nothing in this file but the version.
-- Transaction: never commits (a function cannot). Call it inside BEGIN ... COMMIT at READ
--   COMMITTED; the locks last until the end of the caller's transaction.
CREATE OR REPLACE FUNCTION {{ table }}_claim(
    p_id BIGINT,
    p_queue VARCHAR,
    p_pid INTEGER,
    p_waiting_ms INTEGER,
    p_metadata TEXT,
    p_worker_id BIGINT,
    p_now TIMESTAMPTZ DEFAULT NULL
)
RETURNS TABLE (
    outcome TEXT,
    attempt INTEGER,
    state SMALLINT,
    predecessor_id BIGINT,
    promoted_id BIGINT,
    callback_name VARCHAR,
    parameters_json JSON,
    parameters BYTEA,
    queue VARCHAR,
    priority INTEGER,
    serial_group VARCHAR,
    identifier VARCHAR,
    mode VARCHAR,
    coalesce_threshold BIGINT
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    c RECORD;
BEGIN
    SELECT * INTO c
    FROM {{ table }}_claim_job(p_id, p_queue, p_pid, p_waiting_ms, p_metadata, p_worker_id, p_now);

    RETURN QUERY
    SELECT
        c.o_outcome,
        c.o_attempt,
        c.o_state,
        c.o_predecessor_id,
        c.o_promoted_id,
        j.callback_name,
        j.parameters_json,
        j.parameters,
        j.queue,
        j.priority,
        j.serial_group,
        j.identifier,
        j.mode,
        j.coalesce_threshold
    FROM (SELECT p_id AS id) AS k
    LEFT JOIN {{ table }} AS j ON j.id = k.id AND c.o_outcome <> 'missing';
END;
$$;
