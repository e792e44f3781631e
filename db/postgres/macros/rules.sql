{#- bgq's shared SQL rules for PostgreSQL 15: each is written here once and used by every
    function that needs it (`bgq install-procs` and sqlfluff render them with Jinja). `j` is the
    jobs table's alias in the calling statement ('' for none); the function has p_queue and v_now
    in scope. -#}

{#- The job belongs to the queue p_queue or to one of its sub-queues '<p_queue>_<sub>'. -#}
{% macro in_queue(j='') -%}
{%- set c = j ~ '.' if j else '' -%}
({{ c }}queue = p_queue OR LEFT({{ c }}queue, LENGTH(p_queue) + 1) = p_queue || '_')
{%- endmacro %}

{#- The job's postponement is over: GREATEST(created_at, last_attempt_at) + CEIL(postponed_by / 1000) s
    <= v_now (a NULL last_attempt_at or postponed_by counts as none). -#}
{% macro postponement_over(j='') -%}
{%- set c = j ~ '.' if j else '' -%}
GREATEST({{ c }}created_at, COALESCE({{ c }}last_attempt_at, {{ c }}created_at))
+ CEIL(COALESCE({{ c }}postponed_by, 0) / 1000.0) * INTERVAL '1 second' <= v_now
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
            AND ({{ c }}queue = pz.name OR LEFT({{ c }}queue, LENGTH(pz.name) + 1) = pz.name || '_')
        )
        OR (pz.kind = 'group' AND {{ c }}serial_group = pz.name)
)
{%- endmacro %}

{#- The claim's write, the same in every claim: PROCESSING, one more attempt, the claim's time,
    process and worker; postponement and error cleared, metadata set to `metadata` (NULL unless
    given). The SET list of an UPDATE of the jobs table aliased `j`; the function has v_now,
    p_pid and p_worker_id in scope. -#}
{% macro claim_write(j='j', metadata='NULL') -%}
state = 2,
number_of_attempts = {{ j }}.number_of_attempts + 1,
last_attempt_at = v_now,
pid = p_pid,
worker_id = p_worker_id,
postponed_by = NULL,
error_message = NULL,
metadata = {{ metadata }},
updated_at = v_now
{%- endmacro %}

{#- Not started yet: BACK_TO_BROKER (-1), READY (1), TEMPORARILY_FAILED (4), WAITING (6),
    BROKER_FAILED (8) in `column` (of the row aliased `j`, or a variable holding a state):
    the states a group's head is chosen among, and {{ table }}_pending_head's predicate, which a
    query must repeat word for word for the planner to use that partial index. -#}
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

{#- The one result writer: the columns a result `r` (a record with state, error, postponed_by,
    execution_time and memory, as {{ table }}_finish_results reads them) writes to its job `j`,
    which is still PROCESSING under the result's claim. A give-back (state 1) undoes the claim;
    one whose attempt was cancelled while it was held (`cancelled`, an SQL condition) is written
    REDUNDANT instead. `finished`: the caller knows every result is FINISHED ({{ table }}_hand_off's
    fast ways), and the same rules are written without the branches that cannot apply. -#}
{% macro result_write(cancelled='FALSE', finished=False) -%}
{%- if finished -%}
state = 3,
error_message = r.error,
postponed_by = r.postponed_by,
execution_time = r.execution_time,
memory = r.memory,
finished_at = v_now,
updated_at = v_now
{%- else -%}
state = CASE WHEN {{ cancelled }} THEN 7 ELSE r.state END,
number_of_attempts = CASE
    WHEN r.state = 1 AND NOT COALESCE({{ cancelled }}, FALSE)
        THEN j.number_of_attempts - 1
    ELSE j.number_of_attempts
END,
error_message = CASE WHEN {{ cancelled }} THEN j.error_message ELSE r.error END,
postponed_by = CASE WHEN {{ cancelled }} THEN NULL ELSE r.postponed_by END,
execution_time = CASE WHEN r.state = 1 THEN j.execution_time ELSE r.execution_time END,
memory = CASE WHEN r.state = 1 THEN j.memory ELSE r.memory END,
pid = CASE WHEN r.state = 1 AND NOT COALESCE({{ cancelled }}, FALSE) THEN NULL ELSE j.pid END,
metadata = CASE WHEN r.state = 1 THEN NULL ELSE j.metadata END,
finished_at = CASE WHEN r.state IN (3, 7) OR {{ cancelled }} THEN v_now ELSE j.finished_at END,
updated_at = v_now
{%- endif -%}
{%- endmacro %}

{#- A group's head `h` that a plain UPDATE of claim_write may claim (under its group lock): not
    WAITING, NORMAL, without a coalescing threshold. Any other head goes through
    {{ table }}_claim_job (predecessor, UNIQUE duplicate and coalescing checks). -#}
{% macro plain_head(h='h') -%}
{{ claimable_not_waiting(h) }} AND {{ h }}.mode = 'normal' AND {{ h }}.coalesce_threshold IS NULL
{%- endmacro %}

{#- No job of serial group `group` (an SQL expression) is PROCESSING: the group is free for a
    claim. One probe of {{ table }}_running_group per group; `r` is the probe's alias. Written as
    a scalar subquery, which the planner always runs per row: a NOT EXISTS may become a hashed
    subplan or a hash anti-join, which reads every entry of the running index (dead ones too: a
    finished job leaves one until the next vacuum) when the statistics say there are few. -#}
{% macro no_job_running(group, r='r') -%}
(SELECT 1 FROM {{ table }} AS {{ r }} WHERE {{ r }}.serial_group = {{ group }} AND {{ r }}.state = 2 LIMIT 1) IS NULL
{%- endmacro %}

{#- The id of serial group `group`'s head: its first unstarted job in (priority, id) order, due
    or not (one index dive on {{ table }}_pending_head); NULL for a group with none. -#}
{% macro group_head_id(group, x='x') -%}
(
    SELECT {{ x }}.id FROM {{ table }} AS {{ x }}
    WHERE {{ x }}.serial_group = {{ group }} AND {{ unstarted(x) }}
    ORDER BY {{ x }}.priority, {{ x }}.id
    LIMIT 1
)
{%- endmacro %}

{#- A group's head `h` (from a dive such as group_head_id's) may be claimed by this call: in a
    claimable state, of the priority range v_min..v_max, of the queue, due, and its group
    (`group`) has no PROCESSING job. The function has v_min, v_max, p_queue and v_now in scope. -#}
{% macro head_claimable(h, group) -%}
{{ claimable(h) }}
AND {{ h }}.priority BETWEEN v_min AND v_max
AND {{ in_queue(h) }}
AND {{ due(h) }}
AND {{ no_job_running(group, 'x') }}
{%- endmacro %}

{#- {{ table }}_cancel asked the job's current attempt to stop: the request came at or after the
    attempt's claim (a request of an earlier attempt does not count). -#}
{% macro abort_requested(j='') -%}
{%- set c = j ~ '.' if j else '' -%}
{{ c }}abort_requested_at >= {{ c }}last_attempt_at
{%- endmacro %}
