-- bgq background_job_unfinished_identifiers, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_unfinished_identifiers(p_queue, p_identifiers_json, p_exclude_processing)
--   p_queue               the base queue (its sub-queues '<p_queue>_<sub>' are included).
--   p_identifiers_json    a JSON array of identifiers (strings) to look at; NULL or '[]' means
--                         every job that has an identifier.
--   p_exclude_processing  1: a PROCESSING job does not count as unfinished; 0: it does.
-- Result: rows (identifier), distinct, ordered by identifier (byte-wise, as on PostgreSQL), of
--   the queue's jobs that still have work ahead: state NOT IN (3 FINISHED, 5 PERMANENTLY_FAILED,
--   7 REDUNDANT), and not 2 PROCESSING either when p_exclude_processing = 1. Identifiers of the
--   array without such a job are left out. (utf8mb4_bin is PAD SPACE: 'a' and 'a ' are one
--   identifier here.)
-- Locks: none (read-only, a consistent read).
-- Fencing: none needed: read-only; the answer may be stale by the time the caller acts on it.
-- Index: background_job_identifier (identifier) when p_identifiers_json names identifiers.
-- Errors: none of its own (p_identifiers_json that is not a JSON array: the server's JSON error).
-- Idempotent: yes.
-- Transaction: never commits; needs none (a single read).
CREATE PROCEDURE background_job_unfinished_identifiers(
    IN p_queue VARCHAR(255),
    IN p_identifiers_json LONGTEXT,
    IN p_exclude_processing TINYINT
)
READS SQL DATA
BEGIN
    IF p_identifiers_json IS NULL OR JSON_LENGTH(p_identifiers_json) = 0 THEN
        SELECT identifier
        FROM background_job
        WHERE
            identifier IS NOT NULL
            AND state NOT IN (3, 5, 7)
            AND (p_exclude_processing = 0 OR state <> 2)
            AND (queue = p_queue OR LEFT(queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
        GROUP BY identifier
        ORDER BY identifier;
    ELSE
        SELECT j.identifier
        FROM
            JSON_TABLE(
                p_identifiers_json, '$[*]' COLUMNS (
                    wanted VARCHAR(255) PATH '$'
                )
            ) AS w
        -- JSON_TABLE's text is utf8mb4 in the server's default collation: compare byte-wise.
        INNER JOIN background_job AS j ON j.identifier = w.wanted COLLATE utf8mb4_bin
        WHERE
            j.state NOT IN (3, 5, 7)
            AND (p_exclude_processing = 0 OR j.state <> 2)
            AND (j.queue = p_queue OR LEFT(j.queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
        GROUP BY j.identifier
        ORDER BY j.identifier;
    END IF;
END
