"""`bgq web`: serve the console with uvicorn, refusing to start open unless bound to loopback."""

from __future__ import annotations

import ipaddress
import socket

from ..errors import ConfigError
from ..queue import Queue
from .app import app
from .auth import Credentials


def is_loopback(host: str) -> bool:
    """Whether every address `host` resolves to is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(
        ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos
    )


def check_open(host: str, credentials: Credentials, no_auth: bool) -> Credentials | None:
    """The credentials to serve with (None: open). Closed by default: without credentials it
    refuses, and `no_auth` is accepted on a loopback address only."""
    if no_auth:
        if not is_loopback(host):
            raise ConfigError(
                f"--no-auth serves the console to anyone: only on a loopback address, not {host!r}."
            )
        return None
    if not credentials:
        raise ConfigError(
            "bgq web refuses to start without credentials: set BGQ_WEB_USER and BGQ_WEB_PASSWORD "
            "(or --user/--password, or BGQ_WEB_TOKEN), or bind to 127.0.0.1 with --no-auth."
        )
    return credentials


def serve(
    queue: Queue, host: str, port: int, credentials: Credentials, no_auth: bool,
    read_queue: Queue | None = None, read_only: bool = False,
) -> None:  # fmt: skip
    import uvicorn

    allowed = check_open(host, credentials, no_auth)
    console = app(
        queue, credentials=allowed, no_auth=allowed is None, read_queue=read_queue, read_only=read_only
    )
    uvicorn.run(console, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)
