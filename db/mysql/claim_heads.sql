-- bgq {{ table }}_claim_heads, version 2 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   CALL {{ table }}_claim_heads(p_groups, p_free, p_queue, p_pid, p_min_priority,
--                                p_max_priority, p_waiting_ms, p_worker_id, p_now, @claimed)
--   The one place where the heads of several groups are claimed together: {{ table }}_hand_off
--   (the groups whose jobs it just wrote) and {{ table }}_claim_batch (the groups of the heads it
--   found) call it.
--   p_groups        the serial groups: a VARCHAR[] on PostgreSQL, a JSON array on MySQL (nulls
--                   and repeats ignored).
--   p_free          NULL, or groups of p_groups' kind whose rows the caller holds locked and
--                   whose PROCESSING job it has just written: their rows are not looked up again
--                   and their running index is not read.
--   p_queue, p_pid, p_min_priority, p_max_priority, p_waiting_ms, p_worker_id, p_now: as in
--                   {{ table }}_claim_batch.
-- Result: no rows: the ids of the heads claimed, PROCESSING now under the caller's claim, in
--   no particular order; PostgreSQL returns them as the function's BIGINT[], MySQL in o_claimed,
--   an OUT parameter holding a JSON array (a nested CALL must send no rows).
-- Claimable: a group's head (first in (priority, id) among the group's unstarted jobs of every
--   queue and state -1, 1, 4, 6, 8, due or not; one index dive on {{ table }}_pending_head)
--   when it is READY, TEMPORARILY_FAILED, WAITING or BROKER_FAILED, due (as in
--   {{ table }}_due_jobs without a broker), of the queue and priority range, while no job of the
--   group is PROCESSING. Nothing else: order inside a group never bends.
-- Steps: the groups that have no row yet (never claimed, or cleared) get one (one INSERT); then
--   the group rows are locked without waiting, and each locked group's head, if it is
--   claimable here, is claimed: a NORMAL head without a coalescing threshold, not WAITING, by
--   one UPDATE for all of them (the columns {{ table }}_claim_job writes: PROCESSING,
--   attempts + 1, last_attempt_at, pid, worker_id; postponed_by, error_message and metadata
--   cleared; being the head of a group without a PROCESSING job is what its predecessor check
--   asks); any other head through {{ table }}_claim_job, which re-checks it under the group
--   lock (predecessor, UNIQUE duplicate, coalescing). Only 'claimed' heads are returned.
-- Locks: the new group rows (an INSERT that waits at most {{ group_lock_wait_s }} s for a
--   concurrent first claim of the same group; past that, the call goes on without those groups:
--   innodb_lock_wait_timeout is {{ group_lock_wait_s }} for that INSERT only, restored at once,
--   also on error), then the group rows FOR UPDATE SKIP LOCKED, in serial_group order (those this
--   transaction holds already are taken as well): a group row another transaction holds is not
--   waited for, and that group's head is left alone. Then the claimed job rows.
-- Fencing: every claim is conditional on a claimable state.
-- Errors: none of its own. Idempotent: no (a second call may claim the next heads).
-- MySQL 8: SKIP LOCKED (8.0.1+), JSON_TABLE (8.0.4+) and JSON_ARRAYAGG (8.0.14+) are accepted by
--   MariaDB 10.11 and MySQL 8 alike.
-- Group row (every claim of a group's job writes it, the rule of every claiming procedure): the
--   group rows of the heads claimed by the one UPDATE are written too (macros/rules.sql
--   group_touch), not only locked FOR UPDATE SKIP LOCKED, which holds on one Galera node only;
--   the other heads' rows are written by {{ table }}_claim_job. Two nodes' claims of one group
--   so always write one row, and one of them fails certification at COMMIT (1213, retried by
--   the caller). Version 2: the plain heads' group rows were only locked.
-- Transaction: never commits. Call it inside START TRANSACTION ... COMMIT at READ COMMITTED.
CREATE PROCEDURE {{ table }}_claim_heads(
    IN p_groups LONGTEXT,
    IN p_free LONGTEXT,
    IN p_queue VARCHAR(255),
    IN p_pid INT,
    IN p_min_priority INT,
    IN p_max_priority INT,
    IN p_waiting_ms INT,
    IN p_worker_id BIGINT,
    IN p_now DATETIME(6),
    OUT o_claimed LONGTEXT
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now DATETIME(6) DEFAULT COALESCE(p_now, UTC_TIMESTAMP(6));
    DECLARE v_min INT DEFAULT COALESCE(p_min_priority, -2147483648);
    DECLARE v_max INT DEFAULT COALESCE(p_max_priority, 2147483647);
    DECLARE v_free LONGTEXT DEFAULT COALESCE(p_free, '[]');
    DECLARE v_old_wait INT DEFAULT @@SESSION.innodb_lock_wait_timeout;
    DECLARE v_missing INT DEFAULT 0;
    DECLARE v_group VARCHAR(255) COLLATE utf8mb4_bin;
    DECLARE v_locked LONGTEXT;
    DECLARE v_long LONGTEXT;
    DECLARE v_long_count INT DEFAULT 0;
    DECLARE v_i INT DEFAULT 0;
    DECLARE v_list LONGTEXT;
    DECLARE v_rest LONGTEXT;
    DECLARE v_plain LONGTEXT DEFAULT '[]';
    DECLARE v_plain_groups LONGTEXT DEFAULT '[]';
    DECLARE v_head BIGINT UNSIGNED;
    DECLARE v_outcome VARCHAR(16);
    DECLARE v_attempt INT;
    DECLARE v_state SMALLINT;
    DECLARE v_predecessor BIGINT UNSIGNED;
    DECLARE v_promoted BIGINT UNSIGNED;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        SET SESSION innodb_lock_wait_timeout = v_old_wait;
        RESIGNAL;
    END;

    SET o_claimed = JSON_ARRAY();
    -- The groups whose rows are not held yet (p_free's are: see p_free).
    SELECT COALESCE(JSON_ARRAYAGG(n.name), JSON_ARRAY()) INTO v_rest
    FROM JSON_TABLE(p_groups, '$[*]' COLUMNS (name VARCHAR(255) PATH '$')) AS n
    WHERE n.name IS NOT NULL AND NOT JSON_CONTAINS(v_free, JSON_QUOTE(n.name));
    IF JSON_LENGTH(v_rest) > 0 THEN
        -- The groups that have no row yet (a plain read).
        SELECT COUNT(*) INTO v_missing
        FROM JSON_TABLE(v_rest, '$[*]' COLUMNS (name VARCHAR(255) PATH '$')) AS n
        WHERE
            n.name IS NOT NULL
            AND NOT EXISTS (
                SELECT 1 FROM {{ table }}_group AS r
                WHERE r.serial_group = n.name COLLATE utf8mb4_bin
            );
        IF v_missing > 0 THEN
            new_rows: BEGIN
                -- A concurrent first claim holds one of them: those groups wait for a later call.
                DECLARE EXIT HANDLER FOR 1205 BEGIN END;
                SET SESSION innodb_lock_wait_timeout = {{ group_lock_wait_s }};
                INSERT IGNORE INTO {{ table }}_group (serial_group, updated_at)
                SELECT DISTINCT
                    n.name,
                    v_now
                FROM JSON_TABLE(v_rest, '$[*]' COLUMNS (name VARCHAR(255) PATH '$')) AS n
                WHERE
                    n.name IS NOT NULL
                    AND NOT EXISTS (
                        SELECT 1 FROM {{ table }}_group AS r
                        WHERE r.serial_group = n.name COLLATE utf8mb4_bin
                    )
                ORDER BY n.name;
            END new_rows;
            SET SESSION innodb_lock_wait_timeout = v_old_wait;
        END IF;
    END IF;

    -- The group rows, without waiting, by their primary key (see run_listed); p_free's groups
    -- are held already.
    SELECT COALESCE(JSON_ARRAYAGG(d.name), JSON_ARRAY()) INTO v_locked
    FROM (
        SELECT DISTINCT n.name
        FROM JSON_TABLE(p_groups, '$[*]' COLUMNS (name VARCHAR(255) PATH '$')) AS n
        WHERE JSON_CONTAINS(v_free, JSON_QUOTE(n.name))
    ) AS d;
    SET v_list = NULL;
    IF JSON_LENGTH(v_rest) > 0 THEN
        {{ listed('v_rest', 'v_list', 'name') | indent(8) }};
    END IF;
    IF v_list IS NOT NULL THEN
        {{ run_listed(
            'bgq_heads_lock',
            'SELECT JSON_ARRAYAGG(serial_group) INTO @bgq_locked FROM ' ~ table ~ '_group WHERE serial_group IN',
            'v_list',
            ' FOR UPDATE SKIP LOCKED',
        ) | indent(8) }}
        SET v_locked = JSON_MERGE_PRESERVE(v_locked, COALESCE(@bgq_locked, JSON_ARRAY()));
    END IF;
    IF JSON_LENGTH(v_locked) > 0 THEN
        -- Each locked group's head (one index dive each), if it is claimable here: the plain
        -- ones claimed at once, the others (WAITING, UNIQUE, RECURRING, coalescing) kept for
        -- {{ table }}_claim_job. (A free group's running index is not read: see p_free.)
        SELECT STRAIGHT_JOIN
            JSON_ARRAYAGG(IF(
                {{ plain_head('h') }}, h.id, NULL
            )) AS plain,
            JSON_ARRAYAGG(IF(
                {{ plain_head('h') }}, NULL, h.id
            )) AS other,
            SUM(NOT ({{ plain_head('h') }})) AS others,
            JSON_ARRAYAGG(IF(
                {{ plain_head('h') }},
                h.serial_group,
                NULL
            )) AS plain_groups
        INTO v_plain, v_long, v_long_count, v_plain_groups
        FROM (
            SELECT {{ group_head_id('l.name COLLATE utf8mb4_bin') | indent(12) }} AS head_id
            FROM JSON_TABLE(v_locked, '$[*]' COLUMNS (name VARCHAR(255) PATH '$')) AS l
        ) AS d
        INNER JOIN {{ table }} AS h ON h.id = d.head_id
        WHERE
            {{ head_claimable('h') | indent(12) }}
            AND IF(
                JSON_CONTAINS(v_free, JSON_QUOTE(h.serial_group)),
                TRUE,
                {{ no_job_running('h.serial_group', 'x') }}
            );
    END IF;
    -- The plain heads, by one UPDATE on their primary key (see run_listed): the same columns as
    -- {{ table }}_claim_job writes, under their group rows' locks (so every one is claimed).
    SET o_claimed = JSON_ARRAY();
    {{ listed('v_plain', 'v_list') | indent(4) }};
    IF v_list IS NOT NULL THEN
        SET @bgq_now = v_now, @bgq_pid = p_pid, @bgq_worker = p_worker_id;
        {{ run_listed(
            'bgq_heads_claim',
            'UPDATE ' ~ table ~ ' SET ' ~ claim_write(now='?', pid='?', worker='?') ~ ' WHERE id IN',
            'v_list',
            ' AND ' ~ claimable_not_waiting(),
            '@bgq_now, @bgq_pid, @bgq_worker, @bgq_now',
        ) | indent(8) }}
        -- Their group rows written, not only locked (macros/rules.sql group_touch: on Galera a
        -- lock holds on its own node only; a write is certified on every node).
        {{ listed('v_plain_groups', 'v_list', 'name') | indent(8) }};
        {{ run_listed(
            'bgq_heads_touch',
            'UPDATE ' ~ table ~ '_group SET ' ~ group_touch(now='?') ~ ' WHERE serial_group IN',
            'v_list',
            '',
            '@bgq_now',
        ) | indent(8) }}
        SELECT COALESCE(JSON_ARRAYAGG(d.id), JSON_ARRAY()) INTO o_claimed
        FROM (
            SELECT DISTINCT c.id
            FROM JSON_TABLE(v_plain, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS c
            WHERE c.id IS NOT NULL
        ) AS d;
    END IF;
    -- Then the others, one at a time.
    WHILE v_long_count > 0 AND v_i < JSON_LENGTH(v_long) DO
        SET v_head = JSON_VALUE(v_long, CONCAT('$[', v_i, ']'));
        SET v_i = v_i + 1;
        IF v_head IS NOT NULL THEN
            CALL {{ table }}_claim_job(
                v_head, p_queue, p_pid, p_waiting_ms, NULL, p_worker_id, v_now,
                v_outcome, v_attempt, v_state, v_predecessor, v_promoted
            );
            IF v_outcome = 'claimed' THEN
                SET o_claimed = JSON_ARRAY_APPEND(o_claimed, '$', v_head);
            END IF;
        END IF;
    END WHILE;
END
