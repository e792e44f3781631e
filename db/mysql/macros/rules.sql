{#- bgq's shared SQL rules for MySQL 8 / MariaDB 10.11: each is written here once and used by
    every procedure that needs it (`bgq install-procs` and sqlfluff render them with Jinja).
    `j` is the jobs table's alias in the calling statement ('' for none); the procedure has
    p_queue and v_now in scope. -#}

{#- The job belongs to the queue p_queue or to one of its sub-queues '<p_queue>_<sub>'. -#}
{% macro in_queue(j='') -%}
{%- set c = j ~ '.' if j else '' -%}
({{ c }}queue = p_queue OR LEFT({{ c }}queue, CHAR_LENGTH(p_queue) + 1) = CONCAT(p_queue, '_'))
{%- endmacro %}

{#- The job's postponement is over: GREATEST(created_at, last_attempt_at) + CEIL(postponed_by / 1000) s
    <= v_now (a NULL last_attempt_at or postponed_by counts as none). -#}
{% macro postponement_over(j='') -%}
{%- set c = j ~ '.' if j else '' -%}
GREATEST({{ c }}created_at, COALESCE({{ c }}last_attempt_at, {{ c }}created_at))
+ INTERVAL CEIL(COALESCE({{ c }}postponed_by, 0) / 1000) SECOND <= v_now
{%- endmacro %}

{#- Due in cron mode: a job a broker handed back is due at once, any other once its postponement
    is over; and neither its queue nor its group is paused (not_paused, below). -#}
{% macro due(j='') -%}
{%- set c = j ~ '.' if j else '' -%}
(({{ c }}processed_by_broker = 1 OR {{ postponement_over(j) }}) AND {{ not_paused(j) }})
{%- endmacro %}

{#- Neither the job's queue (nor a queue it is a sub-queue of) nor its serial group is paused
    ({{ table }}_paused, a handful of rows). Part of `due`, so every claim obeys it; a paused
    group's head is skipped, and so is the whole group (its order never bends). -#}
{% macro not_paused(j='') -%}
{%- set c = j ~ '.' if j else '' -%}
NOT EXISTS (
    SELECT 1 FROM {{ table }}_paused AS pz
    WHERE
        (
            pz.kind = 'queue'
            AND (
                {{ c }}queue = pz.name
                OR LEFT({{ c }}queue, CHAR_LENGTH(pz.name) + 1) = CONCAT(pz.name, '_')
            )
        )
        OR (pz.kind = 'group' AND {{ c }}serial_group = pz.name)
)
{%- endmacro %}

{#- The claim's write, the same in every claim: PROCESSING, one more attempt, the claim's time,
    process and worker; postponement and error cleared, metadata set to `metadata` (NULL unless
    given). The SET list of an UPDATE of the jobs table; `j` qualifies every column (the alias in a
    multi-table UPDATE, '' for none); the procedure has v_now, p_pid and p_worker_id in scope. -#}
{% macro claim_write(j='', metadata='NULL', now='v_now', pid='p_pid', worker='p_worker_id') -%}
{%- set c = j ~ '.' if j else '' -%}
{{ c }}state = 2,
{{ c }}number_of_attempts = {{ c }}number_of_attempts + 1,
{{ c }}last_attempt_at = {{ now }},
{{ c }}pid = {{ pid }},
{{ c }}worker_id = {{ worker }},
{{ c }}postponed_by = NULL,
{{ c }}error_message = NULL,
{{ c }}metadata = {{ metadata }},
{{ c }}updated_at = {{ now }}
{%- endmacro %}

{#- The one result writer: the columns a result writes to its job (of the row aliased `j`, or
    unqualified), which is still PROCESSING under the result's claim. The result's fields are SQL
    expressions (by default {{ table }}_finish_results' variables; `memory` already SQL NULL for
    a JSON null). A give-back (state 1) undoes the claim; one whose attempt was cancelled while
    it was held (`cancelled` = 1) is written REDUNDANT instead. MySQL assigns left to right:
    error_message reads the row before state changes. `finished`: the caller knows every result
    is FINISHED ({{ table }}_hand_off's fast ways), and the same rules are written without the
    branches that cannot apply. -#}
{% macro result_write(
    j='', state='v_state', error='v_error', postponed_by='v_postponed_by',
    execution_time='v_execution_time', memory='v_memory', cancelled='v_cancelled', now='v_now',
    finished=False
) -%}
{%- set c = j ~ '.' if j else '' -%}
{%- if finished -%}
{{ c }}execution_time = {{ execution_time }},
{{ c }}memory = {{ memory }},
{{ c }}finished_at = {{ now }},
{{ c }}error_message = {{ error }},
{{ c }}postponed_by = {{ postponed_by }},
{{ c }}updated_at = {{ now }},
{{ c }}state = 3
{%- else -%}
{{ c }}number_of_attempts = IF(
    {{ state }} = 1 AND {{ cancelled }} = 0, {{ c }}number_of_attempts - 1, {{ c }}number_of_attempts
),
{{ c }}execution_time = IF({{ state }} = 1, {{ c }}execution_time, {{ execution_time }}),
{{ c }}memory = IF({{ state }} = 1, {{ c }}memory, {{ memory }}),
{{ c }}pid = IF({{ state }} = 1 AND {{ cancelled }} = 0, NULL, {{ c }}pid),
{{ c }}metadata = IF({{ state }} = 1, NULL, {{ c }}metadata),
{{ c }}finished_at = IF({{ state }} IN (3, 7) OR {{ cancelled }} = 1, {{ now }}, {{ c }}finished_at),
{{ c }}error_message = IF({{ cancelled }} = 1, {{ c }}error_message, {{ error }}),
{{ c }}postponed_by = IF({{ cancelled }} = 1, NULL, {{ postponed_by }}),
{{ c }}updated_at = {{ now }},
{{ c }}state = IF({{ cancelled }} = 1, 7, {{ state }})
{%- endif -%}
{%- endmacro %}

{#- A statement on rows listed by key, run with PREPARE: `list` (an SQL expression: the ids, or
    group names written as literals by `listed`) is written into it, so the statement can only
    reach those rows by their primary key. A join with a JSON list may be planned as a scan of the
    table, which would lock rows of other transactions' jobs or groups (and wait for them, or take
    them from the other transactions). `head` and `tail` come before and after the list's
    parentheses; `values`, the variables of its ? placeholders; ROW_COUNT() of the statement ends
    in `rows` (NULL: not kept). `name`: the prepared statement's name. -#}
{% macro run_listed(name, head, list, tail, values='', rows=None) -%}
SET @bgq_sql = CONCAT('{{ head | replace("'", "''") }} (', {{ list }}, '){{ tail | replace("'", "''") }}');
PREPARE {{ name }} FROM @bgq_sql;
EXECUTE {{ name }}{% if values %} USING {{ values }}{% endif %};
{% if rows %}SET {{ rows }} = ROW_COUNT();
{% endif %}DEALLOCATE PREPARE {{ name }};
{%- endmacro %}

{#- The list `run_listed` writes in, from a JSON array `json` of ids (`kind` 'id') or of group
    names (`kind` 'name', each a utf8mb4 hex literal: no quoting to get wrong, whatever the name
    and sql_mode): one SELECT ... INTO `into` (NULL for an empty array). -#}
{% macro listed(json, into, kind='id') -%}
{%- if kind == 'id' -%}
SELECT GROUP_CONCAT(DISTINCT l.v) INTO {{ into }}
FROM JSON_TABLE({{ json }}, '$[*]' COLUMNS (v BIGINT UNSIGNED PATH '$')) AS l
WHERE l.v IS NOT NULL
{%- else -%}
SELECT GROUP_CONCAT(DISTINCT CONCAT('_utf8mb4 0x', HEX(l.v), ' COLLATE utf8mb4_bin')) INTO {{ into }}
FROM JSON_TABLE({{ json }}, '$[*]' COLUMNS (v VARCHAR(255) PATH '$')) AS l
WHERE l.v IS NOT NULL
{%- endif -%}
{%- endmacro %}

{#- Not started yet: BACK_TO_BROKER (-1), READY (1), TEMPORARILY_FAILED (4), WAITING (6),
    BROKER_FAILED (8) in `column` (of the row aliased `j`, or a variable holding a state):
    the states a group's head is chosen among; pending_group is set for exactly these. -#}
{% macro unstarted(j='', column='state') -%}
{%- set c = j ~ '.' if j else '' -%}
{{ c }}{{ column }} IN (-1, 1, 4, 6, 8)
{%- endmacro %}

{#- Claimable: READY (1), TEMPORARILY_FAILED (4), WAITING (6), BROKER_FAILED (8) in `column`
    (of the row aliased `j`, or a variable holding a state): the states every claim takes a job
    in (whether it is due is `due`'s question). -#}
{% macro claimable(j='', column='state') -%}
{%- set c = j ~ '.' if j else '' -%}
{{ c }}{{ column }} IN (1, 4, 6, 8)
{%- endmacro %}

{#- Claimable but not WAITING: READY (1), TEMPORARILY_FAILED (4), BROKER_FAILED (8). A WAITING
    job is claimed only through {{ table }}_claim_job, which first re-checks its predecessor. -#}
{% macro claimable_not_waiting(j='', column='state') -%}
{%- set c = j ~ '.' if j else '' -%}
{{ c }}{{ column }} IN (1, 4, 8)
{%- endmacro %}

{#- A group's head `h` that a plain UPDATE of claim_write may claim (under its group lock): not
    WAITING, NORMAL, without a coalescing threshold. Any other head goes through
    {{ table }}_claim_job (predecessor, UNIQUE duplicate and coalescing checks). -#}
{% macro plain_head(h='h') -%}
{{ claimable_not_waiting(h) }} AND {{ h }}.mode = 'normal' AND {{ h }}.coalesce_threshold IS NULL
{%- endmacro %}

{#- No job of serial group `group` (an SQL expression) is PROCESSING: the group is free for a
    claim. One probe of the running_group index; `r` is the probe's alias. -#}
{% macro no_job_running(group, r='r') -%}
NOT EXISTS (SELECT 1 FROM {{ table }} AS {{ r }} WHERE {{ r }}.running_group = {{ group }})
{%- endmacro %}

{#- The id of serial group `group`'s head (an SQL expression; a string needs its collation
    here): its first unstarted job in (priority, id) order, due or not (one index dive on
    (pending_group, priority, id)); NULL for a group with none. -#}
{% macro group_head_id(group, x='x') -%}
(
    SELECT {{ x }}.id FROM {{ table }} AS {{ x }}
    WHERE {{ x }}.pending_group = {{ group }}
    ORDER BY {{ x }}.priority, {{ x }}.id
    LIMIT 1
)
{%- endmacro %}

{#- A group's head `h` (from a dive such as group_head_id's) may be claimed by this call: in a
    claimable state, of the priority range v_min..v_max, of the queue, due; and, when `group` is
    given, its group has no PROCESSING job (a caller that knows more about the group, such as
    that it holds its row or just wrote its PROCESSING job, tests that itself). The procedure has
    v_min, v_max, p_queue and v_now in scope. -#}
{% macro head_claimable(h, group=None) -%}
{{ claimable(h) }}
AND {{ h }}.priority BETWEEN v_min AND v_max
AND {{ in_queue(h) }}
AND {{ due(h) }}
{%- if group %}
AND {{ no_job_running(group, 'x') }}
{%- endif %}
{%- endmacro %}

{#- {{ table }}_cancel asked the job's current attempt to stop: the request came at or after the
    attempt's claim (a request of an earlier attempt does not count). -#}
{% macro abort_requested(j='') -%}
{%- set c = j ~ '.' if j else '' -%}
{{ c }}abort_requested_at >= {{ c }}last_attempt_at
{%- endmacro %}

{#- The group row's write that every claim of a group's job makes (and every result of one):
    `updated_at` always moves, by at least a microsecond, so the row really changes. Galera
    (docs/scale-out/galera.md) certifies writes only: a locking read (FOR UPDATE) and an upsert
    that leaves the row as it was hold only on their own node, so two nodes could each claim a
    job of one group. Two transactions that write one row cannot both commit on a cluster: the
    second fails certification (1213) and is retried. The right-hand side of a SET or of an
    ON DUPLICATE KEY UPDATE; `now` is the clock. -#}
{% macro group_touch(now='v_now') -%}
updated_at = GREATEST({{ now }}, updated_at + INTERVAL 1 MICROSECOND)
{%- endmacro %}
