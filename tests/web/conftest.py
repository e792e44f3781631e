"""The console served by uvicorn on a free loopback port, and Debian's chromium driven by Playwright."""

from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the web extra is not installed (pip install 'bgq[web]')")
playwright_sync = pytest.importorskip("playwright.sync_api", reason="playwright is a dev dependency")

import uvicorn  # noqa: E402

from bgq.errors import PermanentErrorException  # noqa: E402
from bgq.web import Credentials, app  # noqa: E402
from tests.conftest import IN_CI  # noqa: E402
from tests.support.helpers import wait_until  # noqa: E402

ADMIN = {"username": "ada", "password": "admin-secret"}
READER = {"username": "rick", "password": "reader-secret"}
CREDENTIALS = Credentials(
    admins={ADMIN["username"]: ADMIN["password"]}, readers={READER["username"]: READER["password"]}
)


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    path = chromium_path()
    if path is None:
        message = "chromium is not installed (tools/install-chromium.sh)"
        if IN_CI:
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)
    with playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield browser
        browser.close()


class Flaky:
    """Callbacks whose outcome the test decides: `fail` holds the names that fail for good."""

    def __init__(self) -> None:
        self.fail: set[str] = set()
        self.ran: list[str] = []

    def callback(self, name: str) -> Callable[..., None]:
        def run(*args: Any, **kwargs: Any) -> None:
            if name in self.fail:
                raise PermanentErrorException(f"{name} is broken")
            self.ran.append(name)

        return run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Console:
    """A running console: its base URL, its queue, the callbacks' switch."""

    def __init__(self, queue: Any, flaky: Flaky) -> None:
        self.queue = queue
        self.flaky = flaky
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app(queue, credentials=CREDENTIALS), host="127.0.0.1", port=self.port, log_level="warning",
            timeout_graceful_shutdown=1,
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, "uvicorn started")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def console(make_queue: Callable[..., Any]) -> Iterator[Console]:
    flaky = Flaky()
    queue = make_queue(
        callbacks={name: flaky.callback(name) for name in ("mail", "charge", "sync")}, priorities=[1, 2]
    )
    running = Console(queue, flaky)
    yield running
    running.stop()


@pytest.fixture
def pages(browser: Any, console: Console) -> Iterator[Callable[..., Any]]:
    """pages(ADMIN) -> a new page logged in as that user (None: no credentials)."""
    contexts: list[Any] = []

    def open_page(user: dict[str, str] | None) -> Any:
        context = browser.new_context(http_credentials=user, base_url=console.url)
        context.set_default_timeout(10_000)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()
