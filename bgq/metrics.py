"""Prometheus metrics (extra `metrics`): the tables read at scrape time, and what the workers count.

Read from the tables at each scrape (one transaction, bgq/sql/calls.py `table_stats`):
  bgq_jobs{queue,state}                  jobs per queue and state (every state, 0 included)
  bgq_oldest_job_age_seconds{queue,state} now minus the oldest created_at of those jobs
  bgq_groups_blocked{queue}              serial groups whose jobs wait behind a failed job of theirs
                                         (TEMPORARILY_FAILED or BROKER_FAILED)
  bgq_workers{mode}                      registered worker processes ({table}_worker) per mode
Counted in the worker processes (once `enable()` was called, or PROMETHEUS_MULTIPROC_DIR is set):
  bgq_jobs_processed_total{queue,callback,outcome}   outcome: the state the run ends in
  bgq_job_duration_seconds{queue,callback}           the callback's run time (histogram)
  bgq_job_wait_seconds{queue}                        first claim minus due time (histogram; first
                                                     attempts only, one extra read per job)
  bgq_reaped_total{queue}                            stalled and dead workers' jobs reaped
No label ever holds a group name, an identifier or a job id (their number has no bound).

Several processes (`bgq work -c N`, several hosts' workers behind one scrape): set
PROMETHEUS_MULTIPROC_DIR to an empty directory for every worker process and for the process that
serves /metrics (prometheus-client's multiprocess mode): `render()` then adds every process's
counters up. `bgq work -c N --metrics-port P` does that itself with a temporary directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from .config import Config
from .errors import ConfigError
from .model import JobState
from .sql.database import Store

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Buckets of the duration and wait histograms, in seconds.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0)


class HasStore(Protocol):
    """What the scrape needs of a queue (a bgq.Queue has it)."""

    @property
    def config(self) -> Config: ...

    @property
    def store(self) -> Store: ...


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError("Metrics need prometheus-client: pip install 'bgq[metrics]'.") from None
    return prometheus_client


# --- counted in the workers ---


class _WorkerMetrics:
    """This process's counters and histograms, in a registry of their own (render() adds it)."""

    def __init__(self) -> None:
        client = _client()
        self.registry: CollectorRegistry = client.CollectorRegistry(auto_describe=True)
        self.processed = client.Counter(
            "bgq_jobs_processed", "Jobs run by this worker, by the state the run ended in.",
            ["queue", "callback", "outcome"], registry=self.registry,
        )  # fmt: skip
        self.duration = client.Histogram(
            "bgq_job_duration_seconds", "Callback run time.", ["queue", "callback"],
            buckets=BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.wait = client.Histogram(
            "bgq_job_wait_seconds", "First claim minus due time (first attempts).", ["queue"],
            buckets=BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.reaped = client.Counter(
            "bgq_reaped", "Jobs reaped (stalled, or their worker dead).", ["queue"], registry=self.registry
        )


_worker: _WorkerMetrics | None = None
_enabled = bool(os.environ.get(MULTIPROC_ENV))


def enable() -> None:
    """Count in this process (workers call it for --metrics-port; PROMETHEUS_MULTIPROC_DIR does it
    too). Raises ConfigError without prometheus-client."""
    global _enabled
    _client()
    _enabled = True


def enabled() -> bool:
    return _enabled


def _metrics() -> _WorkerMetrics:
    global _worker
    if _worker is None:
        _worker = _WorkerMetrics()
    return _worker


def record_job(queue: str, callback: str, outcome: JobState, seconds: float, wait: float | None) -> None:
    """A job's run ended (bgq/jobs/executor.py). A no-op unless enabled."""
    if not _enabled:
        return
    m = _metrics()
    m.processed.labels(queue, callback, outcome.name.lower()).inc()
    m.duration.labels(queue, callback).observe(seconds)
    if wait is not None:
        m.wait.labels(queue).observe(wait)


def record_reaped(queue: str, count: int) -> None:
    """The reaper took back `count` jobs (bgq/jobs/reaper.py). A no-op unless enabled."""
    if _enabled and count:
        _metrics().reaped.labels(queue).inc(count)


# --- read from the tables at scrape time ---


class TableCollector:
    """A prometheus-client collector that reads the queue's tables at each scrape."""

    def __init__(self, queue: HasStore) -> None:
        self.queue = queue

    def describe(self) -> list[Any]:
        return []  # nothing is read at registration: the database is reached at scrape time only

    def collect(self) -> Iterator[Any]:
        _client()
        from prometheus_client import core

        cfg, store = self.queue.config, self.queue.store
        with store.database.transaction() as conn:
            stats = store.procs.table_stats(conn, cfg.queue)
        jobs = core.GaugeMetricFamily("bgq_jobs", "Jobs per queue and state.", labels=["queue", "state"])
        age = core.GaugeMetricFamily(
            "bgq_oldest_job_age_seconds", "Age of the oldest job per queue and state (created_at).",
            labels=["queue", "state"],
        )  # fmt: skip
        counts = {(q, s): (n, oldest) for q, s, n, oldest in stats.jobs}
        for queue in sorted({cfg.queue} | {q for q, _ in counts}):
            for state in JobState:
                n, oldest = counts.get((queue, int(state)), (0, None))
                jobs.add_metric([queue, state.name.lower()], n)
                if oldest is not None:
                    age.add_metric(
                        [queue, state.name.lower()], max(0.0, (stats.now - oldest).total_seconds())
                    )
        blocked = core.GaugeMetricFamily(
            "bgq_groups_blocked",
            "Serial groups whose jobs wait behind a failed job of theirs.",
            labels=["queue"],
        )
        for queue in sorted({cfg.queue} | set(stats.groups_blocked)):
            blocked.add_metric([queue], stats.groups_blocked.get(queue, 0))
        workers = core.GaugeMetricFamily(
            "bgq_workers", "Registered worker processes per mode.", labels=["mode"]
        )
        for mode in ("work", "consume", "process"):
            workers.add_metric([mode], stats.workers.get(mode, 0))
        yield from (jobs, age, blocked, workers)


class _Registered:
    """A collector that yields another registry's metrics (this process's worker counters)."""

    def __init__(self, source: Callable[[], Any]) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        yield from self.source().collect()


def registry(queue: HasStore) -> CollectorRegistry:
    """A registry with the table's metrics and the workers' counters: every process's (multiprocess
    mode, PROMETHEUS_MULTIPROC_DIR) or this process's own."""
    client = _client()
    reg: CollectorRegistry = client.CollectorRegistry(auto_describe=False)
    reg.register(TableCollector(queue))
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(reg)  # type: ignore[no-untyped-call]
    else:
        reg.register(_Registered(lambda: _metrics().registry))
    return reg


def render(queue: HasStore) -> bytes:
    """The text exposition of `queue`'s metrics (what /metrics answers)."""
    data: bytes = _client().generate_latest(registry(queue))
    return data


#: The Content-Type of render()'s answer.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def asgi_app(queue: HasStore) -> Callable[..., Any]:
    """An ASGI app serving `queue`'s metrics, for the web console to mount at /metrics."""
    app: Callable[..., Any] = _client().make_asgi_app(registry(queue))
    return app


def serve(queue: HasStore, port: int, addr: str = "0.0.0.0") -> Any:
    """Serve /metrics on a daemon thread (`bgq metrics`, `--metrics-port`); the HTTP server
    (call .shutdown() to stop it)."""
    server, _thread = _client().start_http_server(port, addr, registry(queue))
    return server
