-- bgq background_job_resume, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_resume(p_kind, p_name)
--   p_kind  'queue' or 'group'.
--   p_name  the name given to background_job_pause.
-- Result: one row (resumed): 1 when it was paused, 0 when it was not.
-- What it does: deletes the pause row; the next claims take the jobs again in (priority, id)
--   order (nothing else was changed while paused). In broker mode a message that arrived while
--   paused was sent back with a delay (outcome 'paused' of background_job_claim), so no job needs
--   re-publishing.
-- Locks: the pause row. Fencing: none needed. Errors: none. Idempotent: yes. ROW_COUNT() of a
--   DELETE counts deleted rows whatever the client's CLIENT_FOUND_ROWS flag.
-- Transaction: never commits.
CREATE PROCEDURE background_job_resume(
    IN p_kind VARCHAR(8),
    IN p_name VARCHAR(255)
)
MODIFIES SQL DATA
BEGIN
    DELETE FROM background_job_paused
    WHERE kind = p_kind AND name = p_name;
    SELECT ROW_COUNT() AS resumed;
END
