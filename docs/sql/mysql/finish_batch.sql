-- bgq background_job_finish_batch, version 3 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_finish_batch(p_results, p_now)
--   p_results  JSON text: an array of results, each id at most once, as documented in
--              background_job_finish_results: {"id", "attempt", "state", "error", "postponed_by",
--              "execution_time", "memory", "clone_delay_ms"} (state 1 READY gives back a job
--              that was claimed but never started; clone_delay_ms makes a RECURRING job's
--              successor or a WaitingException's copy).
--   p_now      the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: one row per input object
--   id        the job.
--   finished  1 if the result was written, 0 if the caller no longer owns the job.
-- The batched form of background_job_finish for `bgq work`: one call writes every result
--   (background_job_finish_results does the work: group rows locked, jobs written, copies inserted,
--   groups woken). A worker without a broker publishes nothing, so the promoted jobs and copies
--   are not returned: claims find them.
-- Locks, Fencing: those of background_job_finish_results (the group rows of the grouped jobs, in
--   serial_group order, then the job rows; each row is written only WHERE state = 2 AND
--   number_of_attempts = attempt).
-- Errors: those of background_job_finish_results (BQ002, nothing written, when a state is not 1,
--   3, 4, 5 or 7, or when a FINISHED RECURRING job would be written without a clone_delay_ms).
-- Idempotent: yes (a repeated call is fenced out: finished = 0).
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE background_job_finish_batch(
    IN p_results LONGTEXT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_written LONGTEXT;

    CALL background_job_finish_results(p_results, p_now, v_written);

    SELECT
        r.id,
        IF(w.id IS NULL, 0, 1) AS finished
    FROM JSON_TABLE(p_results, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$.id')) AS r
    LEFT JOIN JSON_TABLE(v_written, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$.id')) AS w
        ON w.id = r.id;
END
