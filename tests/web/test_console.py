"""The console without a browser: closed by default, keyset pages that miss and repeat nothing,
the serial-groups view's heads and blockers, on both dialects."""

from __future__ import annotations

import datetime as dt

import pytest
from typer.testing import CliRunner

from bgq.cli.commands import app as cli_app
from bgq.errors import ConfigError
from bgq.sql.reads import JobFilter, Reads
from bgq.web import Credentials, app
from bgq.web.app import blocker, stamp

_NO_CREDENTIALS = {
    "BGQ_WEB_USER": "",
    "BGQ_WEB_PASSWORD": "",
    "BGQ_WEB_READONLY_USER": "",
    "BGQ_WEB_READONLY_PASSWORD": "",
    "BGQ_WEB_TOKEN": "",
}


def test_bgq_web_refuses_to_start_without_credentials():
    result = CliRunner().invoke(cli_app, ["web", "--port", "1"], env=_NO_CREDENTIALS)
    assert result.exit_code == 1
    assert "refuses to start without credentials" in result.output


def test_bgq_web_refuses_no_auth_off_loopback():
    result = CliRunner().invoke(cli_app, ["web", "--no-auth", "--host", "0.0.0.0", "--port", "1"])
    assert result.exit_code == 1
    assert "only on a loopback address" in result.output


def test_half_a_credential_is_an_error():
    with pytest.raises(ConfigError, match="BGQ_WEB_PASSWORD"):
        Credentials.from_env({"BGQ_WEB_USER": "ada"})


def test_the_mountable_app_is_closed_by_default(make_queue, monkeypatch):
    for name in _NO_CREDENTIALS:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="needs credentials"):
        app(make_queue())
    assert app(make_queue(), no_auth=True) is not None
    monkeypatch.setenv("BGQ_WEB_TOKEN", "t0ken")
    assert app(make_queue()) is not None


def _all_pages(reads, conn, f, newest_first, limit):
    seen, after = [], None
    while True:
        page = reads.jobs(conn, f, after, newest_first, limit)
        if not page:
            return seen
        seen.extend(r["id"] for r in page)
        after = page[-1]["id"]


def test_keyset_pages_cover_every_matching_job_once_in_order(make_queue, installed):
    queue = make_queue(priorities=[1, 2])
    ids = {g: [queue.publish("noop", [n], serial_group=g) for n in range(23)] for g in ("a", "b")}
    loose = [queue.publish("noop", [n], identifier=f"i{n % 3}") for n in range(31)]
    reads = Reads(queue.database, installed.table)
    with queue.database.transaction() as conn:
        assert _all_pages(reads, conn, JobFilter(group="a"), True, 7) == sorted(ids["a"], reverse=True)
        assert _all_pages(reads, conn, JobFilter(group="b"), False, 5) == sorted(ids["b"])
        assert _all_pages(reads, conn, JobFilter(identifier="i1"), True, 4) == sorted(
            loose[1::3], reverse=True
        )
        assert _all_pages(reads, conn, JobFilter(), False, 10) == sorted([*ids["a"], *ids["b"], *loose])
        assert _all_pages(reads, conn, JobFilter(states=(3,)), True, 10) == []


def test_the_error_filter_matches_text_literally(make_queue, installed):
    queue = make_queue()
    hit, miss, other = (queue.publish("noop", [n]) for n in range(3))
    for job_id, error in (
        (hit, "Timeout: 100% of 5_0 tries"),
        (miss, "Timeout: 1000 of 500 tries"),
        (other, None),
    ):
        installed.sql("UPDATE {t} SET error_message = %s WHERE id = %s", (error, job_id))
    reads = Reads(queue.database, installed.table)
    with queue.database.transaction() as conn:
        assert [r["id"] for r in reads.jobs(conn, JobFilter(error="100% of 5_0"), None, True, 10)] == [hit]
        assert [r["id"] for r in reads.jobs(conn, JobFilter(error="TIMEOUT"), None, True, 10)] == [miss, hit]


def test_the_groups_view_shows_heads_blockers_and_backlogs(make_queue, installed):
    queue = make_queue(priorities=[1, 2])
    east = [queue.publish("noop", [n], serial_group="east", priority=2) for n in range(3)]
    east_urgent = queue.publish("noop", [9], serial_group="east", priority=1)
    west = [queue.publish("noop", [n], serial_group="west") for n in range(2)]
    queue.publish("noop", [0])  # no group: not in the view
    with queue.database.transaction() as conn:
        queue.procs.claim(conn, west[0], "general", 1, 1000, None)  # west has a running job
    reads = Reads(queue.database, installed.table)
    with queue.database.transaction() as conn:
        views = reads.groups(conn, None, None, 10)
        after_east = reads.groups(conn, "east", None, 10)
        only_west = reads.groups(conn, None, "west", 10)
    assert [(v.name, v.pending, v.oldest_id) for v in views] == [("east", 4, east[0]), ("west", 1, west[1])]
    assert views[0].head["id"] == east_urgent  # (priority, id) order
    assert views[0].running is None
    assert views[1].running["id"] == west[0]
    assert views[1].head["id"] == west[1]
    assert [v.name for v in after_east] == ["west"] and [v.name for v in only_west] == ["west"]
    now = dt.datetime.now(dt.UTC)
    assert blocker(views[0], now) == "nothing: the head is due"
    assert blocker(views[1], now).startswith(f"running job #{west[0]} for ")


def test_a_failed_head_in_backoff_is_named_as_the_blocker(make_queue, installed):
    queue = make_queue()
    head, _ = (queue.publish("noop", [n], serial_group="g") for n in range(2))
    with queue.database.transaction() as conn:
        attempt = queue.procs.claim(conn, head, "general", 1, 1000, None).attempt
    with queue.database.transaction() as conn:
        queue.procs.finish(conn, head, attempt, 4, "boom", 600_000, 1, None)
    with queue.database.transaction() as conn:
        (view,) = Reads(queue.database, installed.table).groups(conn, None, None, 10)
    assert view.head["id"] == head
    assert blocker(view, dt.datetime.now(dt.UTC)).startswith(f"failed head #{head} in backoff until ")


def test_the_live_refresh_fingerprint_changes_with_inserts_and_state_changes_only(make_queue, installed):
    queue = make_queue()
    reads = Reads(queue.database, installed.table)

    def signature():
        with queue.database.transaction() as conn:
            return reads.signature(conn)

    empty = signature()
    assert signature() == empty
    job = queue.publish("noop", [1])
    published = signature()
    assert published != empty
    assert signature() == published
    queue.process()  # READY -> FINISHED: no new row, a new state
    assert installed.sql("SELECT state FROM {t} WHERE id = %s", (job,)) == [{"state": 3}]
    assert signature() != published


def test_a_token_acts_as_admin_and_a_referer_from_the_console_passes_the_origin_check(make_queue, installed):
    from starlette.testclient import TestClient

    queue = make_queue()
    job = queue.publish("noop", [1], postpone_by=3_600_000)
    client = TestClient(app(queue, credentials=Credentials(token="s3cret-token")))
    assert client.get("/jobs").status_code == 401
    assert client.get("/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    bearer = {"Authorization": "Bearer s3cret-token"}
    assert client.get(f"/jobs/{job}", headers=bearer).status_code == 200
    form = {"id": str(job), "confirm": "yes", "reason": "now"}
    elsewhere = client.post(
        "/actions/run_now", data=form, headers={**bearer, "Referer": "http://evil.example/"}
    )
    assert elsewhere.status_code == 403
    assert installed.sql("SELECT postponed_by FROM {t} WHERE id = %s", (job,)) == [
        {"postponed_by": 3_600_000}
    ]
    ours = client.post(
        "/actions/run_now", data=form, headers={**bearer, "Referer": f"http://testserver/confirm?id={job}"}
    )
    assert ours.status_code == 200 and "1 job(s) changed" in ours.text
    assert installed.sql("SELECT postponed_by FROM {t} WHERE id = %s", (job,)) == [{"postponed_by": None}]


@pytest.mark.parametrize("action", ["requeue", "run_now", "cancel"])
def test_an_action_on_an_id_outside_bigint_answers_like_an_unknown_job(make_queue, installed, action):
    """Ids are BIGINTs from 1: any other number is no such job (the database would refuse it as
    out of range), skipped like an id nobody has, never a 500."""
    from starlette.testclient import TestClient

    queue = make_queue()
    job = queue.publish("noop", [1], postpone_by=3_600_000)
    client = TestClient(
        app(queue, no_auth=True), headers={"Referer": "http://testserver/jobs"}, raise_server_exceptions=False
    )
    for bad in (job + 1000, 2**63 - 1, 2**63, 99999999999999999999999, 0, -1):
        page = client.post(f"/actions/{action}", data={"id": str(bad), "confirm": "yes", "reason": "x"})
        assert page.status_code == 200, (bad, page.text[-2000:])
        assert "0 job(s) changed, 1 skipped." in page.text, bad
        assert f"<li>#{bad}: bgq: no such job</li>" in page.text, bad
    assert installed.sql("SELECT state, postponed_by FROM {t} WHERE id = %s", (job,)) == [
        {"state": 1, "postponed_by": 3_600_000}
    ]


def test_mounted_in_another_app_every_link_stays_under_the_mount(make_queue, installed):
    from starlette.applications import Starlette
    from starlette.routing import Mount
    from starlette.testclient import TestClient

    queue = make_queue()
    job = queue.publish("noop", [1], serial_group="g")
    client = TestClient(Starlette(routes=[Mount("/ops/bgq", app=app(queue, no_auth=True))]))
    page = client.get("/ops/bgq/jobs")
    assert page.status_code == 200
    assert f'href="/ops/bgq/jobs/{job}"' in page.text
    assert 'src="http://testserver/ops/bgq/static/htmx.min.js"' in page.text
    assert 'EventSource("/ops/bgq/events")' in page.text
    assert client.get("/ops/bgq/static/htmx.min.js").status_code == 200
    groups = client.get("/ops/bgq/groups").text
    assert 'href="/ops/bgq/jobs?group=g"' in groups
    confirm = client.get(f"/ops/bgq/confirm?action=requeue&id={job}").text
    assert 'action="/ops/bgq/actions/requeue"' in confirm


def test_a_job_page_shows_json_indented_and_pickled_parameters_unopened(make_queue, installed):
    from starlette.testclient import TestClient

    queue = make_queue(allow_pickle=True)
    plain = queue.publish("noop", {"to": "a@example.com", "n": [1, 2]})
    pickled = queue.publish("noop", [{"a set, not JSON"}])
    assert installed.sql("SELECT parameters_json FROM {t} WHERE id = %s", (pickled,)) == [
        {"parameters_json": None}
    ]
    client = TestClient(app(queue, no_auth=True))
    assert (
        "{\n  &#34;to&#34;: &#34;a@example.com&#34;,\n  &#34;n&#34;: [\n    1,"
        in client.get(f"/jobs/{plain}").text
    )
    page = client.get(f"/jobs/{pickled}").text
    assert "(pickled, " in page and "not unpickled" in page
    assert "a set, not JSON" not in page


def test_metrics_is_served_behind_the_consoles_auth_and_counts_the_table(make_queue, installed):
    from prometheus_client.parser import text_string_to_metric_families
    from starlette.testclient import TestClient

    from bgq.model import JobState

    queue = make_queue(callbacks={"noop": lambda *a, **k: None})
    for n in range(3):
        queue.publish("noop", [n])
    queue.publish("noop", [9], postpone_by=3_600_000)
    queue.process()
    client = TestClient(app(queue, credentials=Credentials(readers={"rick": "r"})))
    assert client.get("/metrics").status_code == 401
    response = client.get("/metrics", auth=("rick", "r"))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    got = {s.labels["state"]: s.value for s in families["bgq_jobs"].samples if s.labels["queue"] == "general"}
    rows = installed.sql("SELECT state, COUNT(*) AS n FROM {t} GROUP BY state")
    table = {JobState(int(r["state"])).name.lower(): int(r["n"]) for r in rows}
    assert table == {"finished": 3, "ready": 1}
    assert {state: int(n) for state, n in got.items() if n} == table
    assert set(got) == {s.name.lower() for s in JobState}


def test_a_paused_queue_or_group_is_named_first_as_the_blocker(make_queue, installed):
    from starlette.testclient import TestClient

    queue = make_queue()
    queue.publish("noop", [1], serial_group="east")
    queue.publish("noop", [2], serial_group="west")
    sub = make_queue(queue="general_bulk")
    sub.publish("noop", [3], serial_group="north")
    queue.pause("inventory", group="east", by="ada")
    queue.pause("migration", queue="general", by="bob")  # its sub-queue general_bulk with it
    client = TestClient(app(queue, no_auth=True))
    page = client.get("/groups").text
    rows = {name: page.split(f">{name}</a>")[1].split("</tr>")[0] for name in ("east", "west", "north")}
    assert "paused group east" in rows["east"] and "by ada: inventory" in rows["east"]
    assert "paused queue general" in rows["west"] and "by bob: migration" in rows["west"]
    assert "paused queue general" in rows["north"]
    assert 'data-paused="queue:general"' in client.get("/").text
    queue.resume(queue="general")
    rows_after = client.get("/groups").text
    assert "paused queue" not in rows_after and "paused group east" in rows_after
    assert "nothing: the head is due" in rows_after


def test_pause_and_resume_need_a_confirmation_a_reason_and_the_admin_role(make_queue, installed):
    from starlette.testclient import TestClient

    queue = make_queue()
    client = TestClient(
        app(queue, credentials=Credentials(admins={"ada": "a"}, readers={"rick": "r"})),
        headers={"Referer": "http://testserver/groups"},
    )
    form = {"kind": "group", "name": "east", "confirm": "yes", "reason": "move"}
    assert client.post("/control/pause", data=form, auth=("rick", "r")).status_code == 403
    assert client.post("/control/pause", data={**form, "confirm": ""}, auth=("ada", "a")).status_code == 400
    assert client.post("/control/pause", data={**form, "reason": " "}, auth=("ada", "a")).status_code == 400
    assert client.post("/control/pause", data={**form, "kind": "job"}, auth=("ada", "a")).status_code == 400
    assert queue.paused() == []
    confirm = client.get("/confirm-control?op=pause&kind=queue&name=general", auth=("ada", "a")).text
    assert 'action="/control/pause"' in confirm and "nor of its sub-queues" in confirm
    done = client.post("/control/pause", data=form, auth=("ada", "a"))
    assert done.status_code == 200 and "group east paused." in done.text
    assert [(p.kind, p.name, p.reason, p.paused_by) for p in queue.paused()] == [
        ("group", "east", "move", "ada via bgq web")
    ]
    again = client.post("/control/pause", data=form, auth=("ada", "a")).text
    assert "was paused already" in again
    assert "group east resumed." in client.post("/control/resume", data=form, auth=("ada", "a")).text
    assert queue.paused() == []
    whole = {**form, "kind": "queue", "name": "general"}
    assert "queue general paused." in client.post("/control/pause", data=whole, auth=("ada", "a")).text
    assert [(p.kind, p.name) for p in queue.paused()] == [("queue", "general")]
    queue.publish("noop", [1])
    assert queue.process().outcomes.get("claimed", 0) == 0  # the paused queue starts nothing
    assert "queue general resumed." in client.post("/control/resume", data=whole, auth=("ada", "a")).text
    assert queue.process().outcomes == {"claimed": 1}


def test_the_schedules_page_lists_each_schedule_with_its_last_job(make_queue, installed):
    from starlette.testclient import TestClient

    queue = make_queue()
    queue.schedule("nightly", "30 2 * * *", "noop", timezone="Europe/Prague")
    queue.fire_schedules()
    client = TestClient(app(queue, no_auth=True))
    page = client.get("/schedules").text
    row = page.split('data-name="nightly"')[1].split("</tr>")[0]
    assert "<code>30 2 * * *</code>" in row and "Europe/Prague" in row and "noop" in row
    (stored,) = queue.schedules()
    assert stored.next_fire_at is not None and stamp(stored.next_fire_at) in row
    assert "<td>yes</td>" in row


def test_a_worker_silent_longer_than_worker_dead_after_shows_dead(make_queue, installed):
    from starlette.testclient import TestClient

    from bgq.model import WorkerMode
    from bgq.modes.registry import Registry

    queue = make_queue(worker_heartbeat_interval=60, worker_dead_after=200)  # no beat during the test
    client = TestClient(app(queue, no_auth=True))
    with Registry(queue, WorkerMode.CONSUME, "general") as registry:
        row = client.get("/workers").text.split(f'id="worker-{registry.id}"')[1].split("</tr>")[0]
        assert ">alive<" in row and ">consume<" in row
        installed.sql(
            "UPDATE {t}_worker SET last_heartbeat_at = %s WHERE id = %s",
            (dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(minutes=5), registry.id),
        )
        row = client.get("/workers").text.split(f'id="worker-{registry.id}"')[1].split("</tr>")[0]
        assert ">dead<" in row
        overview = client.get("/").text
        assert '<span id="alive">0</span>' in overview and "(1 dead, not reaped yet)" in overview


def test_cancel_reports_each_outcome_a_running_job_is_asked_to_abort(make_queue, installed):
    from starlette.testclient import TestClient

    queue = make_queue()
    waiting, running, done = (queue.publish("noop", [n], identifier=f"c{n}") for n in range(3))
    with queue.database.transaction() as conn:
        attempt = queue.procs.claim(conn, done, "general", 1, 1000, None).attempt
    with queue.database.transaction() as conn:
        queue.procs.finish(conn, done, attempt, 3, None, None, 1, None)
    with queue.database.transaction() as conn:
        queue.procs.claim(conn, running, "general", 1, 1000, None)
    client = TestClient(app(queue, no_auth=True), headers={"Referer": "http://testserver/failures"})
    form = {"state": "1,2,3", "queue": "general", "confirm": "yes", "reason": "shop closed"}
    page = client.post("/actions/cancel", data=form).text
    assert "2 job(s) changed, 1 left alone, 0 skipped." in page
    cancelled = page.split('id="outcome-cancelled"')[1].split("</p>")[0]
    aborting = page.split('id="outcome-abort_requested"')[1].split("</p>")[0]
    left = page.split('id="outcome-finished"')[1].split("</p>")[0]
    assert f"#{waiting}<" in cancelled and f"#{running}<" not in cancelled
    assert f"#{running}<" in aborting and "asked to abort (running)" in aborting
    assert f"#{done}<" in left
    rows = {r["id"]: r for r in installed.sql("SELECT id, state, abort_requested_at FROM {t}")}
    assert [rows[j]["state"] for j in (waiting, running, done)] == [7, 2, 3]
    assert rows[running]["abort_requested_at"] is not None and rows[done]["abort_requested_at"] is None


def _events(console, count):
    """The first `count` messages of the console's event stream, each as its lines."""
    import base64
    import urllib.request

    token = base64.b64encode(b"ada:admin-secret").decode()
    request = urllib.request.Request(f"{console.url}/events", headers={"Authorization": f"Basic {token}"})
    messages, lines = [], []
    with urllib.request.urlopen(request, timeout=10) as stream:
        while len(messages) < count:
            line = stream.readline().decode().rstrip("\n")
            if line:
                lines.append(line)
            elif lines:
                messages.append(lines)
                lines = []
    return messages


def test_the_event_stream_starts_with_a_change_so_a_page_never_misses_a_publish(console):
    """A page renders its counts, then its browser opens the event stream. Jobs published in
    between are in neither the page nor the stream's first fingerprint, so the stream says
    `change` once as it opens (and as it reopens after a cut): the page refreshes what it shows."""
    retry, first = _events(console, 2)
    assert retry == ["retry: 2000"]
    assert first == ["event: change", "data: "]
