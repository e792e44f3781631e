"""The embedded default: a PostgreSQL server (pgserver) in a local data directory, when no URL is set."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from ..errors import DatabaseUnavailableError

#: Kept short on purpose: PostgreSQL's socket lives in the data directory (107-byte path limit).
DEFAULT_DATA_DIR = "~/.cache/bgq/pgdata"


def data_dir(configured: str | None = None) -> Path:
    raw = configured or os.environ.get("BGQ_DATA_DIR") or DEFAULT_DATA_DIR
    return Path(raw).expanduser().resolve()


def embedded_url(configured_dir: str | None = None) -> str:
    """Start (or reuse) the embedded PostgreSQL and return its SQLAlchemy URL."""
    try:
        with warnings.catch_warnings():  # platformdirs' note, at pgserver's import, that a
            # container has no XDG_RUNTIME_DIR: it falls back to a directory of its own, as it says.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
            import pgserver
    except ImportError:
        raise DatabaseUnavailableError(
            "No database is configured (database_url or BGQ_DATABASE_URL) and the embedded PostgreSQL "
            "is not installed: pip install 'bgq[embedded]', or set BGQ_DATABASE_URL."
        ) from None
    path = data_dir(configured_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        server = pgserver.get_server(path)  # type: ignore[attr-defined]  # (pgserver re-exports it)
    except Exception as exc:
        raise DatabaseUnavailableError(f"The embedded PostgreSQL in {path} did not start: {exc}") from exc
    _keep.append(server)  # stopped when the last process using it exits
    return f"postgresql+psycopg://postgres@/postgres?host={path}"


_keep: list[object] = []
