"""`bgq web`, the operator console (the `web` extra): `bgq.web.app(queue)` is an ASGI app to mount."""

from __future__ import annotations

from .app import ACTIONS, Action, app
from .auth import Credentials

__all__ = ["ACTIONS", "Action", "Credentials", "app"]
