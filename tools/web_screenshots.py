"""Screenshots of the console's pages for the README (docs/screenshots/*.png), on the demo data.

    .venv/bin/python tools/web_screenshots.py [--database-url URL]

Seeds the demo table (bgq/web/demo.py) on the given database (default: the embedded PostgreSQL),
serves the console on a free loopback port and photographs each page with Debian's chromium.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvicorn  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from bgq.sql.install import uninstall  # noqa: E402
from bgq.web import Credentials, app  # noqa: E402
from bgq.web.demo import DEMO_TABLE, demo_queue, seed  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "docs" / "screenshots"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    queue = demo_queue(args.database_url)
    seed(queue)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    console = app(queue, credentials=Credentials(admins={"ada": "demo"}))
    server = uvicorn.Server(uvicorn.Config(console, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=1))  # fmt: skip
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        context = browser.new_context(
            http_credentials={"username": "ada", "password": "demo"},
            base_url=f"http://127.0.0.1:{port}",
            viewport={"width": 1280, "height": 760},
        )
        page = context.new_page()
        shots = {
            "overview": "/",
            "jobs": "/jobs",
            "groups": "/groups",
            "failures": "/failures",
            "workers": "/workers",
            "schedules": "/schedules",
        }
        for name, url in shots.items():
            page.goto(url)
            page.screenshot(path=str(OUT / f"{name}.png"), full_page=False)
        page.goto("/failures?state=5")
        first = page.locator("#jobs tr[data-id]").first.get_attribute("data-id")
        page.goto(f"/jobs/{first}")
        page.screenshot(path=str(OUT / "job.png"), full_page=True)
        page.goto("/confirm?action=requeue&state=5")
        page.fill("#reason", "the feed parser is fixed")
        page.screenshot(path=str(OUT / "confirm.png"))
        browser.close()
    server.should_exit = True
    if args.database_url:  # someone else's database: leave no demo table behind
        uninstall(queue.database, DEMO_TABLE)
    queue.close()
    print(f"wrote {', '.join(sorted(p.name for p in OUT.glob('*.png')))} in {OUT}")


if __name__ == "__main__":
    main()
