"""The console reading from a streaming standby (`bgq web --read-url`), on both dialects: every
page reads on the read URL, the actions go to the primary, and each page says so; with the
standby alone, a read-only console. The "standby" here is the test server through sessions that
refuse writes (as a hot standby's do): a write sent there would fail with ReadOnlyError."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from bgq.web import app

_READ_ONLY_OPTION = {
    "postgres": {"options": "-c default_transaction_read_only=on"},
    "mysql": {"init_command": "SET SESSION TRANSACTION READ ONLY"},
}


def _standby_url(url: str, dialect: str) -> str:
    return (
        sa.make_url(url).update_query_dict(_READ_ONLY_OPTION[dialect]).render_as_string(hide_password=False)
    )


class Statements:
    """Counts the connections an engine hands out: every statement runs on one, also a procedure
    call on the driver's cursor, which SQLAlchemy's statement events do not see."""

    def __init__(self, engine: sa.Engine) -> None:
        self.n = 0
        event.listen(engine, "checkout", self._count)

    def _count(self, *args: object) -> None:
        self.n += 1


@pytest.fixture
def pair(make_queue, installed, dialect) -> Iterator[tuple[object, object]]:
    primary = make_queue()
    standby = make_queue(database_url=_standby_url(installed.url, dialect))
    yield primary, standby


def test_pages_read_on_the_standby_and_say_so_and_actions_go_to_the_primary(pair, installed):
    from starlette.testclient import TestClient

    primary, standby = pair
    job = primary.publish("noop", [1], serial_group="g")
    client = TestClient(
        app(primary, no_auth=True, read_queue=standby), headers={"Referer": "http://testserver/"}
    )
    on_primary, on_standby = Statements(primary.database.engine), Statements(standby.database.engine)
    for path in ("/", "/fragments/overview", "/jobs", f"/jobs/{job}", "/groups", "/failures", "/workers",
                 "/schedules"):  # fmt: skip
        response = client.get(path)
        assert response.status_code == 200, path
        if not path.startswith("/fragments/"):  # (a fragment goes inside a page that has it)
            assert "Reading from a standby" in response.text, path
            assert "actions go to the primary" in response.text, path
    assert on_primary.n == 0, "a page read on the primary"
    assert on_standby.n > 0
    assert "Requeue" in client.get(f"/jobs/{job}").text  # actions offered
    done = client.post("/actions/cancel", data={"id": str(job), "confirm": "yes", "reason": "standby test"})
    assert done.status_code == 200 and "1 job(s) changed" in done.text
    assert installed.sql("SELECT state FROM {t} WHERE id = %s", (job,)) == [{"state": 7}]  # REDUNDANT


def test_without_a_read_url_there_is_no_banner(pair):
    from starlette.testclient import TestClient

    primary, _ = pair
    assert "Reading from a standby" not in TestClient(app(primary, no_auth=True)).get("/").text


def test_the_standby_alone_is_a_read_only_console(pair, installed):
    from starlette.testclient import TestClient

    primary, standby = pair
    job = primary.publish("noop", [2])
    client = TestClient(app(standby, no_auth=True, read_only=True), headers={"Referer": "http://testserver/"})
    page = client.get(f"/jobs/{job}").text
    assert "Reading from a standby" in page and "actions are off" in page
    assert "(read-only)" in page
    assert 'action="/actions/' not in page and "/confirm?action=" not in page
    assert client.get(f"/confirm?action=requeue&id={job}").status_code == 403
    refused = client.post("/actions/cancel", data={"id": str(job), "confirm": "yes", "reason": "x"})
    assert refused.status_code == 403
    assert client.post("/control/pause", data={"kind": "queue", "name": "general", "confirm": "yes",
                                               "reason": "x"}).status_code == 403  # fmt: skip
    assert installed.sql("SELECT state FROM {t} WHERE id = %s", (job,)) == [{"state": 1}]  # untouched


def test_bgq_web_read_url_reads_on_the_standby_and_alone_is_read_only(installed, dialect, monkeypatch):
    """`bgq web --read-url`: with --database-url the pages read on the standby, the actions go to
    the primary; with the standby alone the console is read-only. (serve() is replaced by a
    recorder of what it was given: uvicorn would serve for ever.)"""
    from typer.testing import CliRunner

    import bgq.web.serve
    from bgq.cli.commands import app as cli_app

    served: list[dict[str, object]] = []

    def record(queue, host, port, credentials, no_auth, read_queue=None, read_only=False):
        served.append({"queue": queue, "read_queue": read_queue, "read_only": read_only})

    monkeypatch.setattr(bgq.web.serve, "serve", record)
    standby = _standby_url(installed.url, dialect)
    env = {"BGQ_APP": "", "BGQ_DATABASE_URL": ""}
    both = CliRunner().invoke(
        cli_app, ["--database-url", installed.url, "--table", installed.table, "web", "--no-auth",
                  "--read-url", standby], env=env,
    )  # fmt: skip
    assert both.exit_code == 0, both.output
    assert "reading from" in both.output and "read-only" not in both.output
    alone = CliRunner().invoke(
        cli_app, ["--table", installed.table, "web", "--no-auth", "--read-url", standby], env=env
    )
    assert alone.exit_code == 0, alone.output
    assert "read-only" in alone.output
    first, second = served
    assert first["read_queue"] is not None and first["read_only"] is False
    assert first["queue"].config.database_url == installed.url
    assert second["read_queue"] is None and second["read_only"] is True
    assert second["queue"].config.database_url == standby
    for call in served:
        for q in (call["queue"], call["read_queue"]):
            if q is not None:
                q.close()
