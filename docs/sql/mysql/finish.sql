-- bgq background_job_finish, version 3 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_finish(p_id, p_attempt, p_state, p_error, p_postponed_by,
--                           p_execution_time, p_memory, p_clone_delay_ms, p_now)
--   p_id              the job.
--   p_attempt         the claim token returned by background_job_claim (its `attempt`).
--   p_state           the outcome: 3 FINISHED, 4 TEMPORARILY_FAILED, 5 PERMANENTLY_FAILED or
--                     7 REDUNDANT; or 1 READY, which gives back a job that was claimed but never
--                     started (as in background_job_finish_results: attempts - 1, pid and metadata
--                     cleared). A grouped job given back wakes its group like a result, so the
--                     promoted job is returned for publishing (bgq consume's give-back).
--   p_error           error_message to store (NULL on success).
--   p_postponed_by    ms before the job may run again (the backoff of a temporary failure).
--   p_execution_time  ms the callback took (NULL when it did not succeed).
--   p_memory          JSON {"before": ..., "after": ...} (NULL when it did not succeed).
--   p_clone_delay_ms  NULL, or: insert a fresh copy of the job due after this many ms (the
--                     clone_delay_ms of background_job_finish_results: RECURRING jobs that finished,
--                     WaitingException; a FINISHED RECURRING job's own row is then deleted).
--   p_now             the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: exactly one row
--   finished           1 if the result was written, 0 if the caller no longer owns the job.
--   promoted_id        the group's WAITING head that this finish moved to READY, or NULL.
--   promoted_queue, promoted_priority: where to publish promoted_id in broker mode.
--   clone_id           the copy inserted for p_clone_delay_ms, or NULL (it has the job's queue
--                      and priority; publish it with delay p_clone_delay_ms in broker mode).
-- Steps: the state is checked, then background_job_finish_results writes the result as the one
--   object of a batch (its Steps: the group row locked, the job updated only while it is still
--   PROCESSING under the caller's claim, the copy inserted, the group woken).
-- Locks, Fencing: as documented in background_job_finish_results (the group row, then the job row,
--   then the promoted row; WHERE state = 2 AND number_of_attempts = p_attempt: a worker whose
--   job was reaped and claimed again elsewhere presents an old token, finished = 0 and nothing
--   changes).
-- Errors: 31002 / SQLSTATE BQ002 when p_state is not 1, 3, 4, 5 or 7, or when a FINISHED
--   RECURRING job would be written without p_clone_delay_ms (raised before anything is written).
-- Idempotent: yes (a repeated call is fenced out: finished = 0).
-- MySQL 8: JSON_EXTRACT(p_memory, '$') nests the memory as JSON on both (MariaDB has no
--   CAST(... AS JSON)).
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE background_job_finish(
    IN p_id BIGINT UNSIGNED,
    IN p_attempt INT,
    IN p_state SMALLINT,
    IN p_error LONGTEXT,
    IN p_postponed_by INT,
    IN p_execution_time INT,
    IN p_memory LONGTEXT,
    IN p_clone_delay_ms INT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_written LONGTEXT;

    IF p_state IS NULL OR p_state NOT IN (1, 3, 4, 5, 7) THEN
        SIGNAL SQLSTATE 'BQ002'
            SET MYSQL_ERRNO = 31002, MESSAGE_TEXT = 'bgq: finish state must be 1, 3, 4, 5 or 7';
    END IF;

    CALL background_job_finish_results(
        JSON_ARRAY(
            JSON_OBJECT(
                'id', p_id,
                'attempt', p_attempt,
                'state', p_state,
                'error', p_error,
                'postponed_by', p_postponed_by,
                'execution_time', p_execution_time,
                'memory', JSON_EXTRACT(p_memory, '$'),
                'clone_delay_ms', p_clone_delay_ms
            )
        ),
        p_now,
        v_written
    );

    -- One row whether or not the result was written (an aggregate without GROUP BY).
    SELECT
        r.finished,
        r.promoted_id,
        p.queue AS promoted_queue,
        p.priority AS promoted_priority,
        r.clone_id
    FROM (
        SELECT
            COUNT(w.id) AS finished,
            MAX(w.promoted_id) AS promoted_id,
            MAX(w.clone_id) AS clone_id
        FROM
            JSON_TABLE(
                v_written, '$[*]' COLUMNS (
                    id BIGINT UNSIGNED PATH '$.id',
                    promoted_id BIGINT UNSIGNED PATH '$.promoted_id',
                    clone_id BIGINT UNSIGNED PATH '$.clone_id'
                )
            ) AS w
    ) AS r
    LEFT JOIN background_job AS p ON p.id = r.promoted_id;
END
