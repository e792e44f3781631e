"""The catalogue of bgq's stored procedures: one Proc signature per db/<dialect>/<name>.sql."""

from __future__ import annotations

from ..db import Proc

# Signatures of db/<dialect>/<name>.sql; the PostgreSQL types double as documentation.
CLAIM = Proc(
    "claim",
    (
        ("p_id", "bigint"),
        ("p_queue", "varchar"),
        ("p_pid", "integer"),
        ("p_waiting_ms", "integer"),
        ("p_metadata", "text"),
        ("p_worker_id", "bigint"),
        ("p_now", "timestamptz"),
    ),
)
FINISH = Proc(
    "finish",
    (
        ("p_id", "bigint"),
        ("p_attempt", "integer"),
        ("p_state", "integer"),
        ("p_error", "text"),
        ("p_postponed_by", "integer"),
        ("p_execution_time", "integer"),
        ("p_memory", "text"),
        ("p_clone_delay_ms", "integer"),
        ("p_now", "timestamptz"),
    ),
)
CLAIM_BATCH = Proc(
    "claim_batch",
    (
        ("p_queue", "varchar"),
        ("p_limit", "integer"),
        ("p_pid", "integer"),
        ("p_min_priority", "integer"),
        ("p_max_priority", "integer"),
        ("p_max_heads", "integer"),
        ("p_waiting_ms", "integer"),
        ("p_worker_id", "bigint"),
        ("p_now", "timestamptz"),
    ),
)
FINISH_BATCH = Proc("finish_batch", (("p_results", "text"), ("p_now", "timestamptz")))
HAND_OFF = Proc(
    "hand_off",
    (
        ("p_results", "text"),
        ("p_groups", "text"),
        ("p_queue", "varchar"),
        ("p_pid", "integer"),
        ("p_min_priority", "integer"),
        ("p_max_priority", "integer"),
        ("p_waiting_ms", "integer"),
        ("p_worker_id", "bigint"),
        ("p_now", "timestamptz"),
    ),
)
PREDECESSOR = Proc("predecessor", (("p_id", "bigint"),), function=True)
GROUP_HEADS = Proc("group_heads", ())
PROMOTE_WAITING = Proc("promote_waiting", (("p_now", "timestamptz"),))
DUE_JOBS = Proc(
    "due_jobs",
    (("p_queue", "varchar"), ("p_broker_mode", "integer"), ("p_limit", "integer"), ("p_now", "timestamptz")),
)
REQUEUE = Proc("requeue", (("p_id", "bigint"), ("p_reason", "text"), ("p_now", "timestamptz")))
RUN_NOW = Proc("run_now", (("p_id", "bigint"), ("p_reason", "text"), ("p_now", "timestamptz")))
REAP = Proc(
    "reap",
    (
        ("p_queue", "varchar"),
        ("p_timeout_s", "integer"),
        ("p_limit", "integer"),
        ("p_backoff_ms", "integer"),
        ("p_now", "timestamptz"),
    ),
)
BROKER_FAILED = Proc("broker_failed", (("p_id", "bigint"), ("p_error", "text"), ("p_now", "timestamptz")))
BACK_TO_BROKER = Proc(
    "back_to_broker", (("p_queue", "varchar"), ("p_limit", "integer"), ("p_now", "timestamptz"))
)
LOST_MESSAGES = Proc(
    "lost_messages",
    (("p_queue", "varchar"), ("p_timeout_s", "integer"), ("p_limit", "integer"), ("p_now", "timestamptz")),
)
HEARTBEAT = Proc(
    "heartbeat",
    (("p_id", "bigint"), ("p_attempt", "integer"), ("p_metadata", "text"), ("p_now", "timestamptz")),
)
UNFINISHED_IDENTIFIERS = Proc(
    "unfinished_identifiers",
    (("p_queue", "varchar"), ("p_identifiers_json", "text"), ("p_exclude_processing", "integer")),
)
MONITOR = Proc("monitor", (("p_queue", "varchar"), ("p_long_s", "integer"), ("p_now", "timestamptz")))
CLEAR_FINISHED = Proc(
    "clear_finished", (("p_queue", "varchar"), ("p_before", "timestamptz"), ("p_now", "timestamptz"))
)
WORKER_REGISTER = Proc(
    "worker_register",
    (
        ("p_host", "varchar"),
        ("p_pid", "integer"),
        ("p_mode", "varchar"),
        ("p_queue", "varchar"),
        ("p_version", "varchar"),
        ("p_now", "timestamptz"),
    ),
)
WORKER_HEARTBEAT = Proc(
    "worker_heartbeat",
    (("p_id", "bigint"), ("p_current_job_id", "bigint"), ("p_jobs_done", "bigint"), ("p_now", "timestamptz")),
)
WORKER_DEREGISTER = Proc("worker_deregister", (("p_id", "bigint"),))
WORKER_REAP = Proc(
    "worker_reap",
    (
        ("p_queue", "varchar"),
        ("p_dead_after_s", "integer"),
        ("p_limit", "integer"),
        ("p_backoff_ms", "integer"),
        ("p_now", "timestamptz"),
    ),
)
PAUSE = Proc(
    "pause",
    (
        ("p_kind", "varchar"),
        ("p_name", "varchar"),
        ("p_reason", "text"),
        ("p_by", "varchar"),
        ("p_now", "timestamptz"),
    ),
)
RESUME = Proc("resume", (("p_kind", "varchar"), ("p_name", "varchar")))
PAUSES = Proc("pauses", ())
CANCEL = Proc("cancel", (("p_id", "bigint"), ("p_reason", "text"), ("p_now", "timestamptz")))
SCHEDULE_UPSERT = Proc(
    "schedule_upsert",
    (
        ("p_name", "varchar"),
        ("p_cron", "varchar"),
        ("p_timezone", "varchar"),
        ("p_callback", "varchar"),
        ("p_parameters_json", "text"),
        ("p_queue", "varchar"),
        ("p_group", "varchar"),
        ("p_priority", "integer"),
        ("p_missed", "varchar"),
        ("p_next_at", "timestamptz"),
        ("p_now", "timestamptz"),
    ),
)
SCHEDULE_RETIRE = Proc(
    "schedule_retire", (("p_queue", "varchar"), ("p_names_json", "text"), ("p_now", "timestamptz"))
)
SCHEDULES = Proc("schedules", (("p_queue", "varchar"), ("p_due_only", "integer"), ("p_now", "timestamptz")))
FIRE = Proc(
    "fire",
    (
        ("p_name", "varchar"),
        ("p_fire_at", "timestamptz"),
        ("p_next_at", "timestamptz"),
        ("p_now", "timestamptz"),
    ),
)
CLAIM_IDS = Proc(
    "claim_ids",
    (
        ("p_ids", "text"),
        ("p_queue", "varchar"),
        ("p_pid", "integer"),
        ("p_waiting_ms", "integer"),
        ("p_worker_id", "bigint"),
        ("p_now", "timestamptz"),
    ),
)
#: Every installed routine, in install order (schema.sql comes first).
ALL_PROCS: tuple[Proc, ...] = (
    PREDECESSOR,
    CLAIM,
    FINISH,
    CLAIM_BATCH,
    FINISH_BATCH,
    HAND_OFF,
    GROUP_HEADS,
    PROMOTE_WAITING,
    DUE_JOBS,
    REQUEUE,
    REAP,
    BROKER_FAILED,
    BACK_TO_BROKER,
    LOST_MESSAGES,
    HEARTBEAT,
    UNFINISHED_IDENTIFIERS,
    MONITOR,
    CLEAR_FINISHED,
    RUN_NOW,
    WORKER_REGISTER,
    WORKER_HEARTBEAT,
    WORKER_DEREGISTER,
    WORKER_REAP,
    PAUSE,
    RESUME,
    PAUSES,
    CANCEL,
    SCHEDULE_UPSERT,
    SCHEDULE_RETIRE,
    SCHEDULES,
    FIRE,
    CLAIM_IDS,
)
#: Called by the other procedures only, never by Python; installed all the same.
INTERNAL_PROCS: tuple[Proc, ...] = (
    Proc("group_wake", ()),
    Proc("claim_job", ()),
    Proc("claim_heads", ()),
    Proc("finish_results", ()),
)
