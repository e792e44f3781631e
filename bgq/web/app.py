"""The console's pages and actions (Starlette): overview, jobs, groups, failures, workers, schedules."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ..errors import ConfigError, JobNotFoundError, JobStateError
from ..model import Cancelled, JobState, Pause, WorkerRow
from ..queue import Queue
from ..sql.reads import JobFilter, Reads
from .auth import ADMIN, Credentials, Gate

HERE = Path(__file__).resolve().parent
PAGE = 50  # rows per page
#: The most jobs one bulk action changes; the confirmation says when a filter matches more.
MAX_BULK = 10_000
#: Seconds between two looks at the table's fingerprint for the live refresh (PostgreSQL's NOTIFY
#: wakes it sooner).
POLL_S = 2.0


@dataclass(frozen=True)
class Action:
    """A change a person can make, one stored procedure per job: `run(queue, job_id, reason)`
    (its result is not used; JobNotFoundError / JobStateError mean "skipped")."""

    name: str
    label: str
    explains: str  # what it does, on the confirmation page
    run: Callable[[Queue, int, str], object]


#: The console's actions by name. Each runs through a procedure, which records the reason (who
#: and why) in the job and sets updated_at (when). A new one is one entry here.
ACTIONS: dict[str, Action] = {
    "requeue": Action(
        "requeue",
        "Requeue",
        "becomes READY and due at once (any job that is not PROCESSING)",
        lambda q, job_id, reason: q.requeue(job_id, reason),
    ),
    "run_now": Action(
        "run_now",
        "Run now",
        "skips the rest of its postponement or backoff (READY and TEMPORARILY_FAILED jobs only)",
        lambda q, job_id, reason: q.run_now(job_id, reason),
    ),
    "cancel": Action(
        "cancel",
        "Cancel",
        "becomes REDUNDANT with the reason if it has not started (its group moves on); a running one"
        " is asked to abort; a finished or permanently failed one is left alone",
        lambda q, job_id, reason: q.cancel(job_id, reason),
    ),
}

#: What an action's result says happened to a job (queue.cancel's outcomes; any other: changed).
OUTCOMES = {
    "changed": "changed",
    "cancelled": "cancelled (REDUNDANT now)",
    "abort_requested": "asked to abort (running)",
    "finished": "left alone (finished already)",
}

#: Pause and resume of a queue or a serial group (queue.pause / queue.resume), admin only.
CONTROLS = {"pause": "Pause", "resume": "Resume"}


def app(
    queue: Queue,
    *,
    credentials: Credentials | None = None,
    no_auth: bool = False,
    read_queue: Queue | None = None,
    read_only: bool = False,
) -> Starlette:
    """The console for `queue` as an ASGI app, to serve (`bgq web`) or mount in yours.

    `read_queue`: the same table on a streaming standby (`bgq web --read-url`): every page reads
    there, the actions (requeue, cancel, pause...) still go to `queue`, the primary; each page
    says so in a banner. `read_only`: no actions at all (`queue` itself is a standby: `bgq web
    --read-url` without another database).

    Closed by default: without `credentials` they come from the environment (BGQ_WEB_USER and
    BGQ_WEB_PASSWORD, BGQ_WEB_READONLY_USER and BGQ_WEB_READONLY_PASSWORD, BGQ_WEB_TOKEN); with
    none there either it raises ConfigError, unless `no_auth=True` (your app authenticates).
    """
    if no_auth:
        gate_credentials = None
    else:
        gate_credentials = credentials if credentials is not None else Credentials.from_env()
        if not gate_credentials:
            raise ConfigError(
                "bgq web needs credentials: set BGQ_WEB_USER and BGQ_WEB_PASSWORD (or BGQ_WEB_TOKEN), "
                "or pass no_auth=True behind your own authentication."
            )
    console = Console(queue, read_queue, read_only)
    routes = [
        Route("/", console.overview),
        Route("/fragments/overview", console.overview_fragment),
        Route("/jobs", console.jobs),
        Route("/jobs/{job_id:int}", console.job),
        Route("/groups", console.groups),
        Route("/workers", console.workers),
        Route("/schedules", console.schedules),
        Route("/confirm-control", console.confirm_control),
        Route("/control/{op}", console.control, methods=["POST"]),
        Route("/failures", console.failures),
        Route("/confirm", console.confirm),
        Route("/actions/{name}", console.act, methods=["POST"]),
        Route("/events", console.events),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    metrics = _metrics_route(queue)
    if metrics is not None:  # behind the same Gate as the pages (a scraper sends credentials)
        routes.append(metrics)
    starlette = Starlette(routes=routes)
    starlette.add_middleware(Gate, credentials=gate_credentials)
    return starlette


def _metrics_route(queue: Queue) -> Route | None:
    """GET /metrics: bgq.metrics' exposition of `queue` (read at each scrape), or None without
    prometheus-client (the metrics extra)."""
    from .. import metrics

    try:
        metrics._client()
    except ConfigError:
        return None

    def scrape(request: Request) -> Response:  # (sync: Starlette runs it on its thread pool)
        return Response(metrics.render(queue), media_type=metrics.CONTENT_TYPE)

    return Route("/metrics", scrape)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def job_filter(params: Any, default_states: tuple[int, ...] = ()) -> JobFilter:
    """A JobFilter from query or form parameters (state is a comma list of state numbers)."""
    raw = params.get("state") or ""
    states = tuple(s for s in (_int(p) for p in raw.split(",")) if s is not None and s in set(JobState))
    return JobFilter(
        states=states or default_states,
        queue=params.get("queue") or None,
        callback=params.get("callback") or None,
        group=params.get("group") or None,
        identifier=params.get("identifier") or None,
        error=params.get("error") or None,
    )


def pretty_parameters(row: dict[str, Any]) -> str:
    """The parameters as people read them: JSON indented; pickled bytes named, never unpickled."""
    if row.get("parameters_json") is not None:
        value = row["parameters_json"]
        try:
            return json.dumps(json.loads(value) if isinstance(value, str) else value, indent=2)
        except ValueError:
            return str(value)
    raw = row.get("parameters")
    if raw is not None:
        return f"(pickled, {len(bytes(raw))} bytes: not unpickled, since unpickling runs code)"
    return "(none)"


def due_at(job: dict[str, Any]) -> dt.datetime | None:
    """When a job's postponement ends (the procedures' due rule), as aware UTC."""
    created, last = _utc(job.get("created_at")), _utc(job.get("last_attempt_at"))
    if created is None:
        return None
    start = max(created, last) if last is not None else created
    return start + dt.timedelta(seconds=-(-(job.get("postponed_by") or 0) // 1000))


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def age(value: dt.datetime | None, now: dt.datetime) -> str:
    """'3 min 2 s' since `value`."""
    stamp = _utc(value)
    if stamp is None:
        return "-"
    seconds = int((now - stamp).total_seconds())
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    if seconds < 60:
        return f"{sign}{seconds} s"
    if seconds < 3600:
        return f"{sign}{seconds // 60} min {seconds % 60} s"
    if seconds < 86400:
        return f"{sign}{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{sign}{seconds // 86400} d {seconds % 86400 // 3600} h"


def stamp(value: dt.datetime | None) -> str:
    utc = _utc(value)
    return "-" if utc is None else utc.strftime("%Y-%m-%d %H:%M:%S UTC")


def paused_by(pauses: list[Pause], kind: str, name: str | None) -> Pause | None:
    """The pause that holds `name` (a group, or a queue: itself or a queue it is a sub-queue of,
    'mail' of 'mail_bulk', as the claims' not_paused rule)."""
    if name is None:
        return None
    for p in pauses:
        if p.kind == kind and (p.name == name or (kind == "queue" and name.startswith(p.name + "_"))):
            return p
    return None


def blocker(view: Any, now: dt.datetime, pauses: list[Pause] | None = None) -> str:
    """What keeps a serial group's head from running, in words."""
    for kind, name in (("group", view.name), ("queue", (view.head or {}).get("queue"))):
        pause = paused_by(pauses or [], kind, name)
        if pause is not None:
            return (
                f"paused {kind} {pause.name} since {stamp(pause.paused_at)}"
                f" by {pause.paused_by or '-'}: {pause.reason or '-'}"
            )
    if view.running is not None:
        return f"running job #{view.running['id']} for {age(view.running['last_attempt_at'], now)}"
    head = view.head
    if head is None:
        return "nothing"
    state = JobState(head["state"])
    due = due_at(head)
    if state is JobState.TEMPORARILY_FAILED and due is not None and due > now:
        return f"failed head #{head['id']} in backoff until {stamp(due)}"
    if state is JobState.WAITING:
        return f"head #{head['id']} WAITING for its promotion"
    if state is JobState.BROKER_FAILED:
        return f"head #{head['id']} BROKER_FAILED (its message was never sent)"
    if state is JobState.BACK_TO_BROKER:
        return f"head #{head['id']} BACK_TO_BROKER (waits for bgq process)"
    if due is not None and due > now and not head.get("processed_by_broker"):
        return f"head #{head['id']} postponed until {stamp(due)}"
    return "nothing: the head is due"


def chart(minutes: list[dict[str, Any]]) -> dict[str, Any]:
    """The last hour as 60 stacked bars (finished, failed) for an inline SVG, and the totals."""
    finished, failed = [0] * 60, [0] * 60
    for row in minutes:
        minute = int(row["minute"])
        if 0 <= minute < 60:
            finished[minute] += int(row["finished"] or 0)
            failed[minute] += int(row["failed"] or 0)
    top = max([f + e for f, e in zip(finished, failed, strict=True)] + [1])
    bars = [
        {"x": i * 10, "ok": 100 * f / top, "bad": 100 * e / top, "f": f, "e": e}
        for i, (f, e) in enumerate(zip(finished, failed, strict=True))
    ]
    done, bad = sum(finished), sum(failed)
    rate = f"{100 * bad / (done + bad):.1f} %" if done + bad else "-"
    return {"bars": bars, "finished": done, "failed": bad, "rate": rate, "top": top}


class Console:
    """The pages of one queue's console; each page reads in one transaction."""

    def __init__(self, queue: Queue, read_queue: Queue | None = None, read_only: bool = False) -> None:
        self.queue = queue  # the primary: actions, pauses
        self.reader = read_queue or queue  # every page's reads (a standby, with --read-url)
        self.read_only = read_only
        #: The banner's words, or None: reading from the primary.
        self.standby = (
            None
            if read_queue is None and not read_only
            else f"{self.reader.database.safe_url}: pages may lag the primary by the replication delay; "
            + ("actions are off (no primary given)." if read_only else "actions go to the primary.")
        )
        self.templates = Jinja2Templates(directory=HERE / "templates")
        self.templates.env.globals.update(
            state_name=lambda s: JobState(s).name, stamp=stamp, actions=ACTIONS, max_bulk=MAX_BULK
        )
        self._reads: Reads | None = None
        self._primary_reads: Reads | None = None

    @property
    def reads(self) -> Reads:
        if self._reads is None:
            self.reader.store.procs  # noqa: B018 (checks the install once, as every part does)
            self._reads = Reads(self.reader.database, self.reader.config.table_name)
        return self._reads

    @property
    def primary_reads(self) -> Reads:
        """Reads on the primary: the ids a bulk action changes (a standby may lag)."""
        if self.reader is self.queue:
            return self.reads
        if self._primary_reads is None:
            self._primary_reads = Reads(self.queue.database, self.queue.config.table_name)
        return self._primary_reads

    def render(self, request: Request, template: str, status: int = 200, **context: Any) -> Response:
        state = request.scope.get("state", {})
        root = request.scope.get("root_path", "").rstrip("/")  # where the app is mounted
        path = request.url.path
        here = path[len(root) :] if root and path.startswith(root) else path
        context.update(
            user=state.get("user"), can_act=state.get("role") == ADMIN and not self.read_only,
            request=request, root=root, here=here, standby=self.standby,
        )  # fmt: skip
        context.setdefault("table", self.queue.config.table_name)
        return self.templates.TemplateResponse(request, template, context, status_code=status)

    # --- overview ---

    def _overview(self) -> dict[str, Any]:
        now = dt.datetime.now(dt.UTC)
        with self.reader.database.transaction() as conn:
            counts = self.reads.counts(conn)
            oldest = self.reads.oldest_due(conn, now)
            minutes = self.reads.last_hour(conn, now)
        workers = self.reader.workers()
        alive = sum(1 for w in workers if self._alive(w, now))
        states = sorted({int(r["state"]) for r in counts})
        by_queue: dict[str, dict[int, int]] = {}
        for r in counts:
            by_queue.setdefault(r["queue"], {})[int(r["state"])] = int(r["n"])
        totals = {s: sum(q.get(s, 0) for q in by_queue.values()) for s in states}
        return {
            "states": states,
            "by_queue": by_queue,
            "totals": totals,
            "oldest": oldest,
            "oldest_age": age(oldest["created_at"], now) if oldest else None,
            "chart": chart(minutes),
            "workers_alive": alive,
            "workers_dead": len(workers) - alive,
            "paused": self.reader.paused(),
        }

    def _alive(self, worker: WorkerRow, now: dt.datetime) -> bool:
        """A worker heartbeating within worker_dead_after (0: the reaper never judges: alive)."""
        dead_after = self.queue.config.worker_dead_after
        beat = _utc(worker.last_heartbeat_at)
        return not dead_after or beat is None or (now - beat).total_seconds() <= dead_after

    def overview(self, request: Request) -> Response:
        return self.render(request, "overview.html", **self._overview())

    def overview_fragment(self, request: Request) -> Response:
        return self.render(request, "_overview.html", **self._overview())

    # --- jobs ---

    def _page(self, request: Request, f: JobFilter) -> dict[str, Any]:
        newest_first = request.query_params.get("order", "newest") != "oldest"
        after = _int(request.query_params.get("after"))
        with self.reader.database.transaction() as conn:
            rows = self.reads.jobs(conn, f, after, newest_first, PAGE + 1)
        more, rows = len(rows) > PAGE, rows[:PAGE]
        query = {**f.query(), "order": "newest" if newest_first else "oldest"}
        next_url = f"?{urlencode({**query, 'after': rows[-1]['id']})}" if more and rows else None
        return {"rows": rows, "filter": f, "next_url": next_url, "query": urlencode(f.query()),
                "newest_first": newest_first, "after": after}  # fmt: skip

    def jobs(self, request: Request) -> Response:
        return self.render(request, "jobs.html", **self._page(request, job_filter(request.query_params)))

    def job(self, request: Request) -> Response:
        job_id = int(request.path_params["job_id"])
        with self.reader.database.transaction() as conn:
            row = self.reads.job(conn, job_id)
        if row is None:
            return self.render(
                request, "message.html", 404, title="No such job", message=f"No job #{job_id}."
            )
        now = dt.datetime.now(dt.UTC)
        worker_id = row.get("worker_id")
        worker = next((w for w in self.reader.workers() if w.id == worker_id), None) if worker_id else None
        return self.render(
            request, "job.html", job=row, parameters=pretty_parameters(row), due=due_at(row),
            worker_id=worker_id, worker=worker, worker_alive=worker is not None and self._alive(worker, now),
            json_text=lambda v: "-" if v is None else json.dumps(
                json.loads(v) if isinstance(v, str) else v, indent=2),
            age=lambda v: age(v, now),
        )  # fmt: skip

    def failures(self, request: Request) -> Response:
        f = job_filter(
            request.query_params, default_states=(JobState.TEMPORARILY_FAILED, JobState.PERMANENTLY_FAILED)
        )
        return self.render(request, "failures.html", **self._page(request, f))

    # --- serial groups ---

    def groups(self, request: Request) -> Response:
        after = request.query_params.get("after") or None
        name = request.query_params.get("name") or None
        with self.reader.database.transaction() as conn:
            views = self.reads.groups(conn, after, name, PAGE + 1)
        more, views = len(views) > PAGE, views[:PAGE]
        now = dt.datetime.now(dt.UTC)
        pauses = self.reader.paused()
        rows = [
            {"view": v, "blocker": blocker(v, now, pauses), "oldest_age": age(v.oldest_created_at, now),
             "paused": paused_by(pauses, "group", v.name) is not None}
            for v in views
        ]  # fmt: skip
        next_url = f"?{urlencode({'after': views[-1].name})}" if more and views else None
        return self.render(
            request, "groups.html", rows=rows, next_url=next_url, name=name or "",
            paused_groups=[p for p in pauses if p.kind == "group"],
        )  # fmt: skip

    # --- workers and schedules (read-only) ---

    def workers(self, request: Request) -> Response:
        now = dt.datetime.now(dt.UTC)
        rows = [
            {"w": w, "alive": self._alive(w, now), "beat_age": age(w.last_heartbeat_at, now),
             "up": age(w.started_at, now)}
            for w in self.reader.workers()
        ]  # fmt: skip
        return self.render(request, "workers.html", rows=rows, dead_after=self.queue.config.worker_dead_after)

    def schedules(self, request: Request) -> Response:
        rows = self.reader.schedules()
        return self.render(request, "schedules.html", rows=rows)

    # --- pause and resume of a queue or a group: confirm (GET), then control (POST) ---

    def _control_target(self, params: Any) -> tuple[str | None, str | None, str]:
        op = params.get("op") if params.get("op") in CONTROLS else None
        kind = params.get("kind") if params.get("kind") in ("queue", "group") else None
        return op, kind, (params.get("name") or "").strip()

    def confirm_control(self, request: Request) -> Response:
        if self.read_only:
            return self._read_only(request)
        op, kind, name = self._control_target(request.query_params)
        if op is None or kind is None or not name:
            return self.render(request, "message.html", 400, title="Not understood",
                               message="Pause or resume needs kind (queue or group) and name.")  # fmt: skip
        return self.render(request, "confirm_control.html", op=op, label=CONTROLS[op], kind=kind, name=name)

    async def control(self, request: Request) -> Response:
        """Pause or resume a queue or a group (queue.pause / queue.resume, each one procedure). The
        pause stores the reason and the console user; a resume (which deletes the pause) is logged
        with both."""
        if self.read_only:
            return self._read_only(request)
        form = dict(parse_qsl((await request.body()).decode("utf-8", "replace"), keep_blank_values=True))
        op, kind, name = self._control_target({**form, "op": request.path_params["op"]})
        why = form.get("reason", "").strip()
        if op is None or kind is None or not name or form.get("confirm") != "yes" or not why:
            return self.render(request, "message.html", 400, title="Not done",
                               message="Confirm, name the queue or group and give a reason.")  # fmt: skip
        user = request.scope["state"]["user"]
        target = {"group": name} if kind == "group" else {"queue": name}

        def run() -> bool:
            if op == "pause":
                return self.queue.pause(why, by=f"{user} via bgq web", **target)
            self.queue.config.logger.info(f"bgq: {kind} {name} resumed by {user} via bgq web: {why}")
            return self.queue.resume(**target)

        try:
            changed = await anyio.to_thread.run_sync(run)
        except ConfigError as exc:
            return self.render(request, "message.html", 400, title="Not done", message=str(exc))
        verb = "paused" if op == "pause" else "resumed"
        message = (
            f"{kind} {name} {verb}." if changed else f"{kind} {name} was {verb} already: nothing changed."
        )
        return self.render(request, "message.html", title=CONTROLS[op], message=message, result_id="result")

    def _read_only(self, request: Request) -> Response:
        message = "This console reads from a standby and has no primary: no actions."
        return self.render(request, "message.html", 403, title="Read-only", message=message)

    # --- actions: confirm (GET), then act (POST) ---

    def _target(self, params: Any) -> tuple[Action | None, int | None, JobFilter]:
        action = ACTIONS.get(params.get("action") or params.get("name") or "")
        return action, _int(params.get("id")), job_filter(params)

    def confirm(self, request: Request) -> Response:
        if self.read_only:
            return self._read_only(request)
        action, job_id, f = self._target(request.query_params)
        if action is None:
            return self.render(
                request, "message.html", 404, title="No such action", message="No such action."
            )
        if job_id is None and not f.states:
            return self.render(
                request,
                "message.html",
                400,
                title="Choose jobs",
                message="A bulk action needs a state filter.",
            )
        count = 1
        if job_id is None:
            with self.reader.database.transaction() as conn:
                count = self.reads.count(conn, f)
        fields = {"id": job_id} if job_id is not None else f.query()
        return self.render(request, "confirm.html", action=action, job_id=job_id, filter=f, count=count,
                           fields=fields)  # fmt: skip

    async def events(self, request: Request) -> Response:
        """Server-sent events: `change` when the table changed. PostgreSQL wakes on the jobs
        table's NOTIFY (inserts, released jobs); both dialects also poll a cheap fingerprint
        (Reads.signature) every POLL_S seconds, which sees every other change. The stream says
        `change` once as it opens: what changed between the page's render and this first
        fingerprint (or while a cut stream reconnects) is in neither."""

        def fingerprint() -> tuple[Any, ...]:
            with self.reader.database.transaction() as conn:
                return self.reads.signature(conn)

        async def stream() -> AsyncIterator[str]:
            # LISTEN runs on the primary (a standby refuses it); read-only on a standby: polling.
            listener = (
                None if self.read_only else await anyio.to_thread.run_sync(self.queue.store.procs.listener)
            )
            last = await anyio.to_thread.run_sync(fingerprint)
            try:
                yield "retry: 2000\n\n"
                yield "event: change\ndata: \n\n"
                while not await request.is_disconnected():
                    woke = False
                    if listener is not None:
                        woke = await anyio.to_thread.run_sync(listener.wait, POLL_S)
                    else:
                        await anyio.sleep(POLL_S)
                    now = await anyio.to_thread.run_sync(fingerprint)
                    if woke or now != last:
                        last = now
                        yield "event: change\ndata: \n\n"
                    else:
                        yield ": idle\n\n"  # (a write: a closed connection is noticed)
            finally:
                if listener is not None:
                    listener.close()

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
        )

    async def act(self, request: Request) -> Response:
        """Run an action on one job (`id`) or on every job matching the filter (up to MAX_BULK), each
        through its procedure in a transaction of its own; jobs that changed meanwhile are skipped."""
        if self.read_only:
            return self._read_only(request)
        # An urlencoded form (the only kind the pages send), parsed without python-multipart.
        form = dict(parse_qsl((await request.body()).decode("utf-8", "replace"), keep_blank_values=True))
        action, job_id, f = self._target({**form, "name": request.path_params["name"]})
        why = form.get("reason", "").strip()
        if action is None or form.get("confirm") != "yes" or not why:
            return self.render(request, "message.html", 400, title="Not done",
                                  message="Confirm the action and give a reason.")  # fmt: skip
        reason = f"{why} (by {request.scope['state']['user']} via bgq web)"

        def run() -> tuple[dict[str, list[int]], list[str]]:
            done: dict[str, list[int]] = {}
            skipped: list[str] = []
            if job_id is not None:
                ids = [job_id]
            else:
                if not f.states:
                    return done, ["a bulk action needs a state filter"]
                ids, after = [], None
                while len(ids) < MAX_BULK:
                    with self.queue.database.transaction() as conn:
                        page = self.primary_reads.jobs(conn, f, after, False, min(500, MAX_BULK - len(ids)))
                    if not page:
                        break
                    ids.extend(r["id"] for r in page)
                    after = page[-1]["id"]
            for one in ids:
                try:
                    result = action.run(self.queue, one, reason)
                    outcome = result.outcome if isinstance(result, Cancelled) else "changed"
                    done.setdefault(outcome, []).append(one)
                except (JobNotFoundError, JobStateError) as exc:
                    skipped.append(f"#{one}: {exc}")
            return done, skipped

        outcomes, skipped = await anyio.to_thread.run_sync(run)
        left = outcomes.get("finished", [])  # cancel left a finished job alone: not changed
        done = [i for outcome, ids in outcomes.items() if outcome != "finished" for i in ids]
        return self.render(
            request, "done.html", action=action, done=done, skipped=skipped, reason=reason,
            outcomes={o: outcomes[o] for o in OUTCOMES if o in outcomes}, outcome_names=OUTCOMES,
            left=left,
        )  # fmt: skip
