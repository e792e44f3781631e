-- bgq background_job_predecessor, version 1 (MySQL 8 / MariaDB 10.11)
--
-- Contract
--   SELECT background_job_predecessor(p_id) -> BIGINT UNSIGNED or NULL
--   p_id  the job whose predecessor is wanted.
--   Returns the job of the same serial group that must run before p_id: a PROCESSING job of
--   the group (any priority), else the group's first claimable job (-1, 1, 4, 6, 8) in
--   (priority, id) order when it comes before p_id. NULL when p_id has no group, does not exist
--   or is first in line.
-- Locks: none of its own. It reads with FOR UPDATE, so that under REPEATABLE READ a caller that
--   holds the group lock sees the latest committed rows, not an older snapshot.
-- Cost: two index dives (background_job_running_group, background_job_pending_head), independent of
--   how many jobs wait in the group.
-- Fencing: read-only. Errors: none. Idempotent: yes.
-- Note: groups span every queue of the table (a group never runs two jobs at once, whatever
--   queue they are in).
CREATE FUNCTION background_job_predecessor(p_id BIGINT UNSIGNED)
RETURNS BIGINT UNSIGNED
READS SQL DATA
BEGIN
    DECLARE v_group VARCHAR(255) DEFAULT NULL;
    DECLARE v_priority INT DEFAULT NULL;
    DECLARE v_result BIGINT UNSIGNED DEFAULT NULL;
    DECLARE v_head_priority INT DEFAULT NULL;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_result = NULL;

    SELECT
        serial_group,
        priority
    INTO v_group, v_priority
    FROM background_job
    WHERE id = p_id;
    IF v_group IS NULL THEN
        RETURN NULL;
    END IF;

    SELECT id INTO v_result
    FROM background_job
    WHERE running_group = v_group AND id <> p_id
    FOR UPDATE;
    IF v_result IS NOT NULL THEN
        RETURN v_result;
    END IF;

    -- sqlfluff's mysql dialect cannot parse FOR UPDATE after LIMIT (valid MySQL), hence the noqa.
    SELECT
        id,
        priority
    INTO v_result, v_head_priority
    FROM background_job
    WHERE pending_group = v_group
    ORDER BY priority, id
    LIMIT 1
    FOR UPDATE; -- noqa: PRS
    IF v_result IS NULL OR v_result = p_id THEN
        RETURN NULL;
    END IF;
    IF v_head_priority < v_priority OR (v_head_priority = v_priority AND v_result < p_id) THEN
        RETURN v_result;
    END IF;
    RETURN NULL;
END
