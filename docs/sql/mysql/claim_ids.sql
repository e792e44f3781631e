-- bgq background_job_claim_ids, version 2 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL background_job_claim_ids(p_ids, p_queue, p_pid, p_waiting_ms, p_worker_id, p_now)
--   Broker mode's batch claim: the jobs of a batch of messages, each claimed as background_job_claim
--   would claim it, in one call.
--   p_ids         JSON text: an array of distinct job ids, claimed in the order given.
--   p_queue       the base queue: a job must be in it or in a sub-queue '<p_queue>_<sub>'.
--   p_pid         the worker's process id (stored for people, never used for liveness).
--   p_waiting_ms  postponed_by written when a job has to wait (waiting_job_expiration).
--   p_worker_id   stored in worker_id on every claimed job (NULL: none).
--   p_now         the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: one row per id, in the order given
--   id              the job.
--   outcome, attempt, state, predecessor_id, promoted_id, callback_name, parameters_json,
--   parameters, queue, priority, serial_group, identifier, mode, coalesce_threshold: as
--   documented in background_job_claim, for this job; one more outcome: 'deferred', a grouped job
--   after the first one (nothing changed; state NULL): claim it with background_job_claim in a
--   transaction of its own: a transaction that holds several groups' locks deadlocks with the
--   claims and finishes of other workers (they take group rows in another order).
-- Steps: the ungrouped jobs that are not UNIQUE, are in the queue, claimable (-1, 1, 4, 6, 8)
--   and not paused (macros/rules.sql not_paused) are read with a locking read, then claimed by
--   one UPDATE of the columns background_job_claim_job writes (PROCESSING, attempts + 1,
--   last_attempt_at, pid, worker_id; postponed_by, error_message and metadata cleared): for such
--   a job background_job_claim_job would do exactly that. Every other id goes through
--   background_job_claim_job, in the order given (the group lock, predecessor, UNIQUE duplicate,
--   coalescing, group wake-up: its Steps), except the grouped ones after the first ('deferred').
-- Locks: the ungrouped jobs' rows (the locking read waits for a row another transaction holds,
--   then reads its latest version), then those of background_job_claim_job for each other id (one
--   group row at most, waiting at most 3 s, then the job row). All last until
--   the end of the caller's transaction.
-- Fencing: every write is conditional on a claimable state; a job claimed elsewhere first is
--   'unexpected' or 'skipped' here and nothing is written for it.
-- Errors: none of its own. Idempotent: a second call on the same ids finds them claimed
--   ('unexpected').
-- Group row (every claim of a group's job writes it, the rule of every claiming procedure): a
--   grouped job is claimed by background_job_claim_job, which writes its group row (on Galera a
--   lock holds on one node only, a write is certified on every node: two nodes' claims of one
--   group cannot both commit, the second gets 1213 at COMMIT and is retried). Version 2: this
--   rule, through background_job_claim_job version 4; the body is unchanged.
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE background_job_claim_ids(
    IN p_ids LONGTEXT,
    IN p_queue VARCHAR(255),
    IN p_pid INT,
    IN p_waiting_ms INT,
    IN p_worker_id BIGINT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_pos INT DEFAULT 0;
    DECLARE v_next INT;
    DECLARE v_id BIGINT UNSIGNED;
    DECLARE v_outcome VARCHAR(16);
    DECLARE v_attempt INT;
    DECLARE v_state SMALLINT;
    DECLARE v_predecessor BIGINT UNSIGNED;
    DECLARE v_promoted BIGINT UNSIGNED;
    -- One object per id; a NULL state or id is stored as -99 or 0 (a JSON null would not read
    -- back as NULL on every server version).
    DECLARE v_results LONGTEXT DEFAULT '[]';
    DECLARE v_fast LONGTEXT;
    DECLARE v_grouped INT DEFAULT 0;
    DECLARE v_is_grouped INT;

    -- The ungrouped jobs claim_job would claim, locked (a locking read sees the latest version).
    SELECT JSON_ARRAYAGG(j.id) INTO v_fast
    FROM
        JSON_TABLE(p_ids, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS k
    INNER JOIN background_job AS j ON j.id = k.id
    WHERE
        j.serial_group IS NULL
        AND j.mode <> 'unique'
        AND j.state IN (-1, 1, 4, 6, 8)
        AND (j.queue = p_queue OR LEFT(j.queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
        AND NOT EXISTS (
    SELECT 1 FROM background_job_paused AS pz
    WHERE
        (
            pz.kind = 'queue'
            AND (
                j.queue = pz.name
                OR LEFT(j.queue, CHAR_LENGTH(pz.name) + 1) = CONCAT(pz.name, '_')
            )
        )
        OR (pz.kind = 'group' AND j.serial_group = pz.name)
)
    FOR UPDATE;
    SET v_fast = COALESCE(v_fast, '[]');
    -- A multi-table UPDATE (sqlfluff's layout rule does not parse its join, hence the noqa).
    UPDATE background_job AS j
    INNER JOIN JSON_TABLE(v_fast, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS k  -- noqa: LT02
        ON k.id = j.id  -- noqa: LT02
    SET
        j.state = 2,
        j.number_of_attempts = j.number_of_attempts + 1,
        j.last_attempt_at = v_now,
        j.pid = p_pid,
        j.worker_id = p_worker_id,
        j.postponed_by = NULL,
        j.error_message = NULL,
        j.metadata = NULL,
        j.updated_at = v_now
    WHERE j.state IN (-1, 1, 4, 6, 8);

    -- The other ids, in the order given, through claim_job (MIN: one row even when none is left).
    IF JSON_LENGTH(v_fast) < JSON_LENGTH(p_ids) THEN
        slow: LOOP
            SELECT MIN(k.pos) INTO v_next
            FROM JSON_TABLE(p_ids, '$[*]' COLUMNS (pos FOR ORDINALITY, id BIGINT UNSIGNED PATH '$')) AS k
            WHERE k.pos > v_pos AND NOT JSON_CONTAINS(v_fast, CAST(k.id AS CHAR));
            IF v_next IS NULL THEN
                LEAVE slow;
            END IF;
            SET v_pos = v_next;
            SET v_id = JSON_EXTRACT(p_ids, CONCAT('$[', v_pos - 1, ']'));
            SELECT COUNT(*) INTO v_is_grouped
            FROM background_job
            WHERE id = v_id AND serial_group IS NOT NULL;
            IF v_grouped = 1 AND v_is_grouped = 1 THEN
                SET v_outcome = 'deferred', v_state = NULL, v_predecessor = NULL, v_promoted = NULL;
            ELSE
                CALL background_job_claim_job(
                    v_id, p_queue, p_pid, p_waiting_ms, NULL, p_worker_id, v_now,
                    v_outcome, v_attempt, v_state, v_predecessor, v_promoted
                );
                SET v_grouped = GREATEST(v_grouped, v_is_grouped);
            END IF;
            SET v_results = JSON_ARRAY_APPEND(
                v_results, '$', JSON_OBJECT(
                    'id', v_id,
                    'outcome', v_outcome,
                    'state', COALESCE(v_state, -99),
                    'predecessor_id', COALESCE(v_predecessor, 0),
                    'promoted_id', COALESCE(v_promoted, 0)
                )
            );
        END LOOP slow;
    END IF;

    -- An id without a result of claim_job was claimed by the UPDATE. The contract's column
    -- order, as on PostgreSQL, hence the noqa.
    SELECT  -- noqa: ST06
        k.id,
        COALESCE(r.outcome, 'claimed') AS outcome,
        IF(COALESCE(r.outcome, 'claimed') = 'claimed', j.number_of_attempts, NULL) AS attempt,
        IF(r.id IS NULL, 2, NULLIF(r.state, -99)) AS state,
        NULLIF(r.predecessor_id, 0) AS predecessor_id,
        NULLIF(r.promoted_id, 0) AS promoted_id,
        j.callback_name,
        j.parameters_json,
        j.parameters,
        j.queue,
        j.priority,
        j.serial_group,
        j.identifier,
        j.mode,
        j.coalesce_threshold
    FROM
        JSON_TABLE(p_ids, '$[*]' COLUMNS (pos FOR ORDINALITY, id BIGINT UNSIGNED PATH '$')) AS k
    LEFT JOIN
        JSON_TABLE(
            v_results, '$[*]' COLUMNS (
                id BIGINT UNSIGNED PATH '$.id',
                outcome VARCHAR(16) PATH '$.outcome',
                state SMALLINT PATH '$.state',
                predecessor_id BIGINT UNSIGNED PATH '$.predecessor_id',
                promoted_id BIGINT UNSIGNED PATH '$.promoted_id'
            )
        ) AS r
        ON r.id = k.id
    LEFT JOIN background_job AS j
        ON j.id = k.id AND COALESCE(r.outcome, 'claimed') NOT IN ('missing', 'deferred')
    ORDER BY k.pos;
END
