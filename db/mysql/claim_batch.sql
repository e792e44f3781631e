-- bgq {{ table }}_claim_batch, version 7 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL {{ table }}_claim_batch(p_queue, p_limit, p_pid, p_min_priority, p_max_priority,
--                                p_max_heads, p_waiting_ms, p_worker_id, p_now)
--   Claims only; a worker that finished a grouped job takes the group's next head with
--   {{ table }}_hand_off instead.
--   p_queue         the base queue: jobs in it or in a sub-queue '<p_queue>_<sub>'.
--   p_limit         at most this many jobs are claimed (>= 1).
--   p_pid           the worker's process id (stored for people).
--   p_min_priority, p_max_priority: only jobs with a priority in this range (NULL: no bound).
--   p_max_heads     at most this many of the claimed jobs are group heads (NULL: p_limit). A
--                   worker that takes one group at a time leaves the other groups' heads to
--                   the other workers.
--   p_waiting_ms    passed to {{ table }}_claim_job (a head that lost a race turns WAITING).
--   p_worker_id     stored in worker_id on every claimed job (NULL: none).
--   p_now           the clock (DATETIME(6), UTC); NULL means UTC_TIMESTAMP(6).
-- Result: one row per claimed job, ordered by priority then id; each is PROCESSING, the caller's
--   id, attempt     the job and its claim token for {{ table }}_finish, {{ table }}_finish_batch
--                   or {{ table }}_hand_off.
--   callback_name, parameters_json, parameters, queue, priority, serial_group, identifier,
--   mode, coalesce_threshold: the job as stored.
-- Claimable: a due job (as in {{ table }}_due_jobs without a broker: READY, TEMPORARILY_FAILED,
--   WAITING or BROKER_FAILED whose postponement has passed) of the queue and priority range that
--   is either ungrouped, or the head of its group (first in (priority, id) among the group's
--   unstarted jobs of every queue and state -1, 1, 4, 6, 8, due or not) while no job of the
--   group is PROCESSING. A group whose head is not due, or is in another queue or priority
--   range, is skipped as a whole: order inside a group never bends.
-- Steps: candidates are up to p_limit ungrouped jobs (taken FOR UPDATE SKIP LOCKED) and up to
--   2 * n + 2 group heads (n: p_limit, or p_max_heads if smaller), tried in (priority, id) order
--   until p_limit are claimed. The heads come from the first 4 * (2 * n + 2) + 16 claimable
--   grouped jobs in (priority, id) order ({{ table }}_grouped), each checked by one dive on
--   {{ table }}_pending_head; only when those hold fewer than n heads (the window was too
--   small: its first jobs belong to busy groups, or are not heads), from every group in turn
--   (serial_group order, the next group one dive on {{ table }}_pending_head; a group with a
--   PROCESSING job passed over after one probe of its running index), best first. An ungrouped
--   job that is not UNIQUE is claimed by an UPDATE of the same columns
--   {{ table }}_claim_job writes (PROCESSING, attempts + 1, last_attempt_at, pid, worker_id;
--   postponed_by, error_message and metadata cleared); a UNIQUE one by {{ table }}_claim_job.
--   The candidates are claimed in rounds, in (priority, id) order: each round takes the next
--   ones, as many as are still to claim (and heads up to n), and claims them together, the heads
--   through {{ table }}_claim_heads (each group's head re-derived and checked under its group
--   lock); a candidate that could not be claimed makes room for the next round. Only claimed
--   jobs are returned.
-- Locks: ungrouped candidates FOR UPDATE SKIP LOCKED (never waits for them); group rows FOR
--   UPDATE SKIP LOCKED too ({{ table }}_claim_heads): a head whose group row another
--   transaction holds (a claim or a finish in progress) is left out and the next candidate is
--   tried, so batch claims neither wait for nor deadlock on each other. Only a group that has no
--   row yet (never claimed) gets one from {{ table }}_claim_heads, which waits at most
--   {{ group_lock_wait_s }} s for a concurrent first claim of the same group.
-- Fencing: every write is conditional on a claimable state.
-- Errors: 31002 / SQLSTATE BQ002 when p_limit is NULL or < 1 (nothing written).
-- Idempotent: no (each call claims more jobs); a claimed job is never claimed again.
-- MySQL 8: SKIP LOCKED (8.0.1+) in a derived table and JSON_TABLE (8.0.4+) are accepted by
--   MariaDB 10.11 and MySQL 8 alike. The fallback for the heads costs a few index dives per
--   group with unstarted jobs: it grows with the number of such groups, not with their jobs.
-- Group row (every claim of a group's job writes it, the rule of every claiming procedure):
--   every grouped or UNIQUE claim goes through {{ table }}_claim_heads or {{ table }}_claim_job,
--   which write the claimed job's group row, not only lock it: on Galera a lock holds on one node
--   only, a write is certified on every node, so two nodes' claims of one group cannot both
--   commit (the second gets 1213 at COMMIT and is retried). Version 7: this rule, through
--   {{ table }}_claim_heads version 2; the body is unchanged.
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT.
CREATE PROCEDURE {{ table }}_claim_batch(
    IN p_queue VARCHAR(255),
    IN p_limit INT,
    IN p_pid INT,
    IN p_min_priority INT,
    IN p_max_priority INT,
    IN p_max_heads INT,
    IN p_waiting_ms INT,
    IN p_worker_id BIGINT,
    IN p_now DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_min INT DEFAULT COALESCE(p_min_priority, -2147483648);
    DECLARE v_max INT DEFAULT COALESCE(p_max_priority, 2147483647);
    DECLARE v_candidates LONGTEXT DEFAULT NULL;
    DECLARE v_claimed LONGTEXT DEFAULT '[]';
    DECLARE v_count INT DEFAULT 0;
    DECLARE v_head_limit INT DEFAULT LEAST(p_limit, COALESCE(p_max_heads, p_limit));
    DECLARE v_head_candidates INT DEFAULT 2 * LEAST(p_limit, COALESCE(p_max_heads, p_limit)) + 2;
    DECLARE v_heads INT DEFAULT 0;
    DECLARE v_scan INT DEFAULT 4 * (2 * LEAST(p_limit, COALESCE(p_max_heads, p_limit)) + 2) + 16;
    DECLARE v_head_json LONGTEXT DEFAULT NULL;
    DECLARE v_found INT DEFAULT 0;
    DECLARE v_scanned INT DEFAULT 0;
    DECLARE v_take LONGTEXT DEFAULT JSON_ARRAY();
    DECLARE v_take_unique LONGTEXT DEFAULT JSON_ARRAY();
    DECLARE v_take_groups LONGTEXT DEFAULT JSON_ARRAY();
    DECLARE v_round INT DEFAULT 0;
    DECLARE v_round_heads INT DEFAULT 0;
    DECLARE v_got LONGTEXT;
    DECLARE v_list LONGTEXT;
    DECLARE v_next VARCHAR(255) COLLATE utf8mb4_bin;
    DECLARE v_running INT DEFAULT 0;
    DECLARE v_head BIGINT UNSIGNED;
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_id BIGINT UNSIGNED;
    DECLARE v_outcome VARCHAR(16);
    DECLARE v_attempt INT;
    DECLARE v_state SMALLINT;
    DECLARE v_predecessor BIGINT UNSIGNED;
    DECLARE v_promoted BIGINT UNSIGNED;
    DECLARE v_group VARCHAR(255) COLLATE utf8mb4_bin;
    DECLARE v_mode VARCHAR(16);
    -- Every candidate by primary key, ungrouped first, then groups in serial_group order: no
    -- statement scans (and waits for) rows of other transactions.
    DECLARE one_by_one CURSOR FOR
        SELECT
            c.id,
            c.serial_group,
            c.mode
        FROM
            JSON_TABLE(
                v_candidates, '$[*]' COLUMNS (
                    id BIGINT UNSIGNED PATH '$.id',
                    priority INT PATH '$.priority',
                    serial_group VARCHAR(255) PATH '$.serial_group',
                    mode VARCHAR(16) PATH '$.mode'
                )
            ) AS c
        ORDER BY c.priority, c.id;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;

    IF p_limit IS NULL OR p_limit < 1 THEN
        SIGNAL SQLSTATE 'BQ002'
            SET MYSQL_ERRNO = 31002, MESSAGE_TEXT = 'bgq: claim_batch limit must be at least 1';
    END IF;

    -- Up to 2 * n + 2 group heads (n: p_limit, or p_max_heads if smaller), in (priority, id)
    -- order. First the bounded scan: the first v_scan claimable grouped jobs in (priority, id)
    -- order ({{ table }}_grouped), of which those that are their group's head (its first
    -- unstarted job: one dive on {{ table }}_pending_head) in a group without a
    -- PROCESSING job. Every claimable head is among those jobs, in the same order, so when the
    -- scan finds enough heads, or reads fewer than v_scan jobs (it saw them all), its heads are
    -- the first ones.
    SELECT
        JSON_ARRAYAGG(
            JSON_OBJECT(
                'id', h.id, 'priority', h.priority, 'serial_group', h.serial_group, 'mode', h.mode
            )
        ) AS heads,
        COUNT(*) AS found
    INTO v_head_json, v_found
    FROM (
        SELECT
            s.id,
            s.priority,
            s.serial_group,
            s.mode
        FROM (
            SELECT
                id,
                priority,
                serial_group,
                mode,
                queue,
                created_at,
                last_attempt_at,
                postponed_by,
                processed_by_broker
            FROM {{ table }}
            WHERE grouped_priority BETWEEN v_min AND v_max
            ORDER BY grouped_priority, id
            LIMIT v_scan
        ) AS s
        WHERE
            {{ in_queue('s') }}
            AND {{ due('s') }}
            AND s.id = {{ group_head_id('s.serial_group') | indent(12) }}
            AND {{ no_job_running('s.serial_group') }}
        ORDER BY s.priority, s.id
        LIMIT v_head_candidates
    ) AS h;

    IF v_found < v_head_limit THEN
        SELECT COUNT(*) INTO v_scanned
        FROM (
            SELECT id FROM {{ table }}
            WHERE grouped_priority BETWEEN v_min AND v_max
            ORDER BY grouped_priority, id
            LIMIT v_scan
        ) AS n;
    END IF;

    -- Fewer than n heads among v_scan jobs (the first ones belong to busy groups, or are not
    -- heads; n heads are enough, the spare ones only replace heads whose group is locked):
    -- every group's head, one group at a time in serial_group order ({{ table }}_pending_head:
    -- the next group is one index dive), a group with a PROCESSING job passed over after one
    -- probe of its running index; then the best v_head_candidates of those heads.
    IF v_found < v_head_limit AND v_scanned >= v_scan THEN
        SET v_head_json = JSON_ARRAY(), v_group = NULL;
        group_loop: LOOP
            SET v_next = NULL;
            SELECT pending_group INTO v_next
            FROM {{ table }}
            WHERE pending_group > COALESCE(v_group, '')
            ORDER BY pending_group
            LIMIT 1;
            IF v_next IS NULL THEN
                LEAVE group_loop;
            END IF;
            SET v_group = v_next;
            -- (SELECT ... INTO is a plain read; IF EXISTS (SELECT ...) would be a locking one.)
            SELECT COUNT(*) INTO v_running
            FROM {{ table }}
            WHERE running_group = v_group;
            IF v_running = 0 THEN
                SET v_head = NULL;
                SELECT h.id INTO v_head
                FROM {{ table }} AS h
                WHERE
                    h.id = {{ group_head_id('v_group') | indent(20) }}
                    AND {{ head_claimable('h') | indent(20) }};
                IF v_head IS NOT NULL THEN
                    SET v_head_json = JSON_ARRAY_APPEND(v_head_json, '$', v_head);
                END IF;
            END IF;
        END LOOP;
        SELECT
            JSON_ARRAYAGG(
                JSON_OBJECT(
                    'id', hh.id, 'priority', hh.priority, 'serial_group', hh.serial_group,
                    'mode', hh.mode
                )
            )
        INTO v_head_json
        FROM (
            SELECT
                j.id,
                j.priority,
                j.serial_group,
                j.mode
            FROM JSON_TABLE(v_head_json, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS c
            INNER JOIN {{ table }} AS j ON j.id = c.id
            ORDER BY j.priority, j.id
            LIMIT v_head_candidates
        ) AS hh;
    END IF;

    -- Up to p_limit ungrouped jobs (locked, skipping locked ones) and the heads, in (priority, id)
    -- order.
    SELECT
        JSON_ARRAYAGG(
            JSON_OBJECT(
                'id', c.id, 'priority', c.priority, 'serial_group', c.serial_group, 'mode', c.mode
            )
        )
    INTO v_candidates
    FROM (
        SELECT
            f.id,
            f.priority,
            f.serial_group,
            f.mode
        FROM (
            SELECT
                id,
                priority,
                serial_group,
                mode
            FROM {{ table }}
            WHERE
                ungrouped_priority BETWEEN v_min AND v_max
                AND {{ in_queue() }}
                AND {{ due() }}
            ORDER BY ungrouped_priority, id
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED  -- noqa: PRS
        ) AS f
        UNION ALL
        SELECT
            u.id,
            u.priority,
            u.serial_group,
            u.mode
        FROM
            JSON_TABLE(
                COALESCE(v_head_json, '[]'), '$[*]' COLUMNS (
                    id BIGINT UNSIGNED PATH '$.id',
                    priority INT PATH '$.priority',
                    serial_group VARCHAR(255) PATH '$.serial_group',
                    mode VARCHAR(16) PATH '$.mode'
                )
            ) AS u
    ) AS c;

    -- In rounds, in (priority, id) order: the next candidates, up to what is still to claim
    -- (and heads up to v_head_limit), claimed together: the ungrouped ones by one UPDATE (the
    -- columns {{ table }}_claim_job writes; their rows are locked already) or, if UNIQUE, by
    -- {{ table }}_claim_job; the heads' groups by {{ table }}_claim_heads. A candidate that
    -- could not be claimed (its group row held elsewhere, raced) makes room for the next ones.
    SET v_done = 0;  -- (a SELECT ... INTO above that found no row set it)
    OPEN one_by_one;
    fetch_loop: LOOP
        FETCH one_by_one INTO v_id, v_group, v_mode;
        IF v_done = 0 THEN
            IF v_group IS NULL AND v_mode <> 'unique' THEN
                SET v_take = JSON_ARRAY_APPEND(v_take, '$', v_id), v_round = v_round + 1;
            ELSEIF v_group IS NULL THEN
                SET v_take_unique = JSON_ARRAY_APPEND(v_take_unique, '$', v_id), v_round = v_round + 1;
            ELSEIF v_heads + v_round_heads < v_head_limit THEN
                SET v_take_groups = JSON_ARRAY_APPEND(v_take_groups, '$', v_group);
                SET v_round = v_round + 1, v_round_heads = v_round_heads + 1;
            END IF;
        END IF;
        IF v_round > 0 AND (v_done = 1 OR v_round >= p_limit - v_count) THEN
            -- The ungrouped ones, by one UPDATE on their primary key (see run_listed): the
            -- columns {{ table }}_claim_job writes; their rows are locked by this transaction
            -- since the candidates were read, so every one is claimed.
            {{ listed('v_take', 'v_list') | indent(12) }};
            IF v_list IS NOT NULL THEN
                SET @bgq_now = v_now, @bgq_pid = p_pid, @bgq_worker = p_worker_id;
                {{ run_listed(
                    'bgq_batch_claim',
                    'UPDATE ' ~ table ~ ' SET ' ~ claim_write(now='?', pid='?', worker='?') ~ ' WHERE id IN',
                    'v_list',
                    ' AND ' ~ claimable(),
                    '@bgq_now, @bgq_pid, @bgq_worker, @bgq_now',
                ) | indent(16) }}
                SET v_claimed = JSON_MERGE_PRESERVE(v_claimed, v_take);
            END IF;
            WHILE JSON_LENGTH(v_take_unique) > 0 DO
                SET v_id = JSON_VALUE(v_take_unique, '$[0]');
                SET v_take_unique = JSON_REMOVE(v_take_unique, '$[0]');
                CALL {{ table }}_claim_job(
                    v_id, p_queue, p_pid, p_waiting_ms, NULL, p_worker_id, v_now,
                    v_outcome, v_attempt, v_state, v_predecessor, v_promoted
                );
                IF v_outcome = 'claimed' THEN
                    SET v_claimed = JSON_ARRAY_APPEND(v_claimed, '$', v_id);
                END IF;
            END WHILE;
            IF JSON_LENGTH(v_take_groups) > 0 THEN
                CALL {{ table }}_claim_heads(
                    v_take_groups, NULL, p_queue, p_pid, p_min_priority, p_max_priority,
                    p_waiting_ms, p_worker_id, v_now, v_got
                );
                SET v_claimed = JSON_MERGE_PRESERVE(v_claimed, v_got);
                SET v_heads = v_heads + JSON_LENGTH(v_got);
            END IF;
            SET v_count = JSON_LENGTH(v_claimed), v_round = 0, v_round_heads = 0;
            SET v_take = JSON_ARRAY(), v_take_unique = JSON_ARRAY(), v_take_groups = JSON_ARRAY();
        END IF;
        IF v_done = 1 OR v_count >= p_limit THEN
            LEAVE fetch_loop;
        END IF;
    END LOOP;
    CLOSE one_by_one;

    SELECT
        j.id,
        j.number_of_attempts AS attempt,
        j.callback_name,
        j.parameters_json,
        j.parameters,
        j.queue,
        j.priority,
        j.serial_group,
        j.identifier,
        j.mode,
        j.coalesce_threshold
    FROM JSON_TABLE(v_claimed, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS c
    INNER JOIN {{ table }} AS j ON j.id = c.id
    WHERE j.state = 2
    ORDER BY j.priority, j.id;
END
