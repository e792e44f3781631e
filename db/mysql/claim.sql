-- bgq {{ table }}_claim, version 4 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL {{ table }}_claim(p_id, p_queue, p_pid, p_waiting_ms, p_metadata, p_worker_id, p_now)
--   p_id          the job to claim.
--   p_queue       the base queue: the job must be in it or in a sub-queue '<p_queue>_<sub>'.
--   p_pid         the worker's process id (stored for people, never used for liveness).
--   p_waiting_ms  postponed_by written when the job has to wait (waiting_job_expiration).
--   p_metadata    JSON stored in metadata on a successful claim (NULL stores NULL).
--   p_worker_id   stored in worker_id on a successful claim: the claiming worker (NULL: none).
--   p_now         the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
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
--   state           the job's state after the call (NULL when missing or locked).
--   predecessor_id  the job it waits for ('waiting').
--   promoted_id     a job of the group this call moved WAITING -> READY (publish it).
--   callback_name, parameters_json, parameters, queue, priority, serial_group, identifier,
--   mode, coalesce_threshold: the job as stored (NULL when missing).
-- Steps ({{ table }}_claim_job does them; this procedure adds the job's columns): a claimable
--   state is -1, 1, 4, 6, 8. A grouped job first locks its group row; then the job is re-read
--   under the lock; a UNIQUE duplicate turns REDUNDANT; a job with a predecessor
--   ({{ table }}_predecessor) turns WAITING; otherwise it is claimed (PROCESSING, attempts + 1,
--   last_attempt_at, pid, metadata, worker_id; postponed_by and error_message cleared) and, with a
--   coalesce_threshold, swallows the unstarted jobs of its group whose threshold is >= its own
--   (REDUNDANT). {{ table }}_group_wake then refreshes the group row.
-- Locks: the group row (waits at most {{ group_lock_wait_s }} s: innodb_lock_wait_timeout is set to
--   {{ group_lock_wait_s }} for that one statement and restored at once, also on error), then the
--   job row (FOR UPDATE). Reads after the lock are locking reads, so REPEATABLE READ sees the
--   latest committed rows.
-- Fencing: every write is conditional on a claimable state; a job claimed elsewhere first is
--   'unexpected' or 'skipped' here and nothing is written.
-- Errors: none of its own. Idempotent: a second call on a claimed job is 'unexpected'.
-- Group row (every claim of a group's job writes it, the rule of every claiming procedure): the
--   claim is {{ table }}_claim_job's, which writes the group row (a lock alone holds on one
--   Galera node only; a write is certified on every node: two nodes' claims of one group cannot
--   both commit, the second gets 1213 at COMMIT and is retried). Version 4: this rule, through
--   {{ table }}_claim_job version 4; the body is unchanged.
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE {{ table }}_claim(
    IN p_id BIGINT UNSIGNED,
    IN p_queue VARCHAR(255),
    IN p_pid INT,
    IN p_waiting_ms INT,
    IN p_metadata LONGTEXT,
    IN p_worker_id BIGINT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_outcome VARCHAR(16);
    DECLARE v_attempt INT;
    DECLARE v_state SMALLINT;
    DECLARE v_predecessor BIGINT UNSIGNED;
    DECLARE v_promoted BIGINT UNSIGNED;

    CALL {{ table }}_claim_job(
        p_id, p_queue, p_pid, p_waiting_ms, p_metadata, p_worker_id, p_now,
        v_outcome, v_attempt, v_state, v_predecessor, v_promoted
    );

    SELECT
        v_outcome AS outcome,
        v_attempt AS attempt,
        v_state AS state,
        v_predecessor AS predecessor_id,
        v_promoted AS promoted_id,
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
    LEFT JOIN {{ table }} AS j ON j.id = k.id AND v_outcome <> 'missing';
END
