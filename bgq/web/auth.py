"""The console's gate: HTTP basic or a bearer token, a read-only role, a same-origin check on POSTs."""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import ConfigError

#: Environment variables the credentials come from (`bgq web` and `bgq.web.app(queue)` alike).
ENV_USER, ENV_PASSWORD = "BGQ_WEB_USER", "BGQ_WEB_PASSWORD"
ENV_READONLY_USER, ENV_READONLY_PASSWORD = "BGQ_WEB_READONLY_USER", "BGQ_WEB_READONLY_PASSWORD"
ENV_TOKEN = "BGQ_WEB_TOKEN"

ADMIN, READONLY = "admin", "readonly"


@dataclass(frozen=True)
class Credentials:
    """Who may use the console: `admins` and `readers` ({user: password}, HTTP basic) and a
    `token` (`Authorization: Bearer <token>`, acts as an admin). Readers see every page and can
    act on nothing."""

    admins: Mapping[str, str] = field(default_factory=dict)
    readers: Mapping[str, str] = field(default_factory=dict)
    token: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Credentials:
        env = os.environ if environ is None else environ
        admins: dict[str, str] = {}
        readers: dict[str, str] = {}
        for users, user_var, password_var in (
            (admins, ENV_USER, ENV_PASSWORD),
            (readers, ENV_READONLY_USER, ENV_READONLY_PASSWORD),
        ):
            user, password = env.get(user_var), env.get(password_var)
            if bool(user) != bool(password):
                raise ConfigError(f"Set both {user_var} and {password_var}, or neither.")
            if user and password:
                users[user] = password
        return cls(admins, readers, env.get(ENV_TOKEN) or None)

    def __bool__(self) -> bool:
        return bool(self.admins or self.readers or self.token)

    def identify(self, headers: Headers) -> tuple[str, str] | None:
        """(user, role) for the request's Authorization header, or None."""
        scheme, _, value = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self.token and secrets.compare_digest(value, self.token):
            return "token", ADMIN
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        for users, role in ((self.admins, ADMIN), (self.readers, READONLY)):
            expected = users.get(user)
            if expected is not None and secrets.compare_digest(password.encode(), expected.encode()):
                return user, role
        return None


def same_origin(scope: Scope, headers: Headers) -> bool:
    """Whether a state-changing request comes from a page of this console: its Origin (or, when
    a browser sends none, its Referer) names this host. A request with neither is refused."""
    host = headers.get("host")
    if not host:
        return False
    origin = f"{scope.get('scheme', 'http')}://{host}"
    if "origin" in headers:
        return headers["origin"] == origin
    referer = headers.get("referer", "")
    return referer == origin or referer.startswith(origin + "/")


class Gate:
    """ASGI middleware: every request must carry valid credentials (unless the console runs with
    `no_auth`), and every request that is not GET/HEAD must pass the same-origin check and come
    from an admin. The user and role go into scope["state"] for the pages."""

    def __init__(self, app: ASGIApp, credentials: Credentials | None) -> None:
        self.app = app
        self.credentials = credentials  # None: no authentication (loopback, --no-auth)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if self.credentials is None:
            who: tuple[str, str] | None = ("anonymous", ADMIN)
        else:
            who = self.credentials.identify(headers)
        if who is None:
            response: Any = PlainTextResponse(
                "Authentication required.", 401, {"WWW-Authenticate": 'Basic realm="bgq", charset="UTF-8"'}
            )
            await response(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            refusal = None
            if not same_origin(scope, headers):
                refusal = (
                    "Refused: this request did not come from a page of this console (same-origin check)."
                )
            elif who[1] != ADMIN:
                refusal = f"Refused: {who[0]} has the read-only role and cannot act."
            if refusal is not None:
                await PlainTextResponse(refusal, 403)(scope, receive, send)
                return
        scope.setdefault("state", {}).update(user=who[0], role=who[1])
        await self.app(scope, receive, send)
