-- bgq {{ table }}_finish_batch, version 2 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL {{ table }}_finish_batch(p_results, p_now)
--   p_results  JSON text: an array of objects, each id at most once:
--              {"id", "attempt", "state", "error", "postponed_by", "execution_time", "memory"}
--              with the meaning of {{ table }}_finish's parameters (memory is a JSON object),
--              and one more state: 1 READY gives back a job that was claimed but never
--              started (attempts - 1, pid and metadata cleared; last_attempt_at stays).
--   p_now      the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: one row per input object
--   id        the job.
--   finished  1 if the result was written, 0 if the caller no longer owns the job.
-- The batched form of {{ table }}_finish for `bgq work`: one call writes every result
--   ({{ table }}_finish_results does the work).
--   What it does not do: clones. A WaitingException's copy or a finished RECURRING job's
--   successor needs {{ table }}_finish (p_clone_delay_ms); a FINISHED RECURRING job here is an
--   error, so no recurring job can silently stop recurring. A grouped job's group is woken
--   ({{ table }}_group_wake) as by {{ table }}_finish.
-- Locks: the group rows of the grouped jobs, in serial_group order (upserts), then the job rows.
-- Fencing: each row is written only WHERE state = 2 AND number_of_attempts = attempt.
-- Errors: those of {{ table }}_finish_results (BQ002, nothing written, when a state is not 1,
--   3, 4, 5 or 7, or when a FINISHED RECURRING job would be written here).
-- Idempotent: yes (a repeated call is fenced out: finished = 0).
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE {{ table }}_finish_batch(
    IN p_results LONGTEXT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_written LONGTEXT;

    CALL {{ table }}_finish_results(p_results, p_now, v_written);

    SELECT
        r.id,
        CASE WHEN JSON_CONTAINS(v_written, CAST(r.id AS CHAR)) THEN 1 ELSE 0 END AS finished
    FROM JSON_TABLE(p_results, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$.id')) AS r;
END
