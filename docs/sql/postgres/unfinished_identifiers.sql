-- bgq background_job_unfinished_identifiers, version 1 (PostgreSQL 15)
--
-- Contract
--   SELECT * FROM background_job_unfinished_identifiers(p_queue, p_identifiers_json, p_exclude_processing)
--   p_queue               the base queue (its sub-queues '<p_queue>_<sub>' are included).
--   p_identifiers_json    a JSON array of identifiers (strings) to look at; NULL or '[]' means
--                         every job that has an identifier.
--   p_exclude_processing  1: a PROCESSING job does not count as unfinished; 0: it does.
-- Result: rows (identifier), distinct, ordered by identifier (byte-wise, COLLATE "C", as on
--   MySQL), of the queue's jobs that still have work ahead: state NOT IN (3 FINISHED,
--   5 PERMANENTLY_FAILED, 7 REDUNDANT), and not 2 PROCESSING either when
--   p_exclude_processing = 1. Identifiers of the array without such a job are left out.
--   ('a' and 'a ' are two identifiers here, one on MySQL.)
-- Locks: none (read-only, VOLATILE so that it sees the latest committed rows).
-- Fencing: none needed: read-only; the answer may be stale by the time the caller acts on it.
-- Index: background_job_identifier (identifier) when p_identifiers_json names identifiers.
-- Errors: none of its own (p_identifiers_json that is not a JSON array: the server's JSON error).
-- Idempotent: yes.
-- Transaction: never commits (a function cannot); needs none (a single read).
CREATE OR REPLACE FUNCTION background_job_unfinished_identifiers(
    p_queue VARCHAR,
    p_identifiers_json TEXT,
    p_exclude_processing INTEGER
)
RETURNS TABLE (
    identifier VARCHAR
)
LANGUAGE plpgsql
VOLATILE
AS $$
#variable_conflict use_column
BEGIN
    IF p_identifiers_json IS NULL OR JSON_ARRAY_LENGTH(p_identifiers_json::JSON) = 0 THEN
        RETURN QUERY
        SELECT j.identifier
        FROM background_job AS j
        WHERE j.identifier IS NOT NULL
          AND j.state NOT IN (3, 5, 7)
          AND (p_exclude_processing = 0 OR j.state <> 2)
          AND (j.queue = p_queue OR LEFT(j.queue, LENGTH(p_queue) + 1) = p_queue || '_')
        GROUP BY j.identifier
        ORDER BY j.identifier COLLATE "C";
    ELSE
        RETURN QUERY
        SELECT j.identifier
        FROM background_job AS j
        WHERE j.identifier IN (
                SELECT w.wanted
                FROM JSON_ARRAY_ELEMENTS_TEXT(p_identifiers_json::JSON) AS w (wanted)
            )
          AND j.state NOT IN (3, 5, 7)
          AND (p_exclude_processing = 0 OR j.state <> 2)
          AND (j.queue = p_queue OR LEFT(j.queue, LENGTH(p_queue) + 1) = p_queue || '_')
        GROUP BY j.identifier
        ORDER BY j.identifier COLLATE "C";
    END IF;
END;
$$;
