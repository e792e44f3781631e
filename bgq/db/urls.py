"""Database URLs: bgq's drivers picked, libpq's multi-host form parsed, passwords hidden, dialect named."""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

import sqlalchemy as sa

from ..errors import DatabaseError
from .dialect import Dialect


def dialect_name(backend: str) -> str | None:
    """bgq's name ("mysql" or "postgres") for a SQLAlchemy backend name, or None if unsupported."""
    if backend in ("mysql", "mariadb"):
        return "mysql"
    if backend in ("postgresql", "postgres"):
        return "postgres"
    return None


def dialect_for(url: sa.URL) -> Dialect:
    name = dialect_name(url.get_backend_name())
    if name == "mysql":
        from .mysql import MySQLDialect

        return MySQLDialect()
    if name == "postgres":
        from .postgres import PostgresDialect

        return PostgresDialect()
    raise _unsupported(url.get_backend_name())


def _unsupported(backend: str) -> DatabaseError:
    return DatabaseError(f"Unsupported database {backend!r}: use mysql+pymysql:// or postgresql+psycopg://.")


def normalise_url(raw: str) -> sa.URL:
    """Parse a database URL and pick bgq's drivers when none is named (`postgres://` and
    `postgresql://` become postgresql+psycopg, `mysql://` and `mariadb://` +pymysql). A URL that
    does not parse or names another database raises DatabaseError, before anything connects."""
    try:
        url = sa.make_url(_hosts_to_query(raw))
    except Exception as exc:  # sqlalchemy raises ArgumentError with the URL in it
        raise DatabaseError(f"Invalid database URL: {exc}") from None
    # The driver is read off the URL's text: SQLAlchemy's get_driver_name() loads the dialect,
    # which fails for names it does not know, such as the common "postgres://".
    backend, _, driver = url.drivername.partition("+")
    name = dialect_name(backend)
    if name is None:
        raise _unsupported(backend)
    if name == "mysql" and driver != "pymysql":
        url = url.set(drivername=f"{backend}+pymysql")
    elif name == "postgres" and driver != "psycopg":
        url = url.set(drivername="postgresql+psycopg")
    return url


#: A libpq multi-host URI: scheme://[userinfo@]host1[:port1],host2[:port2].../rest.
_MULTI_HOST = re.compile(
    r"^(?P<scheme>postgres(?:ql)?(?:\+\w+)?)://(?:(?P<auth>[^@/?]*)@)?(?P<hosts>[^/?@]*,[^/?@]*)(?P<rest>[/?].*)?$"
)


def _hosts_to_query(raw: str) -> str:
    """libpq's multi-host URI, `postgresql://u@h1:p1,h2:p2/db?...`, in the form SQLAlchemy
    parses (its URL has one host and one port): `postgresql://u@/db?host=h1:p1&host=h2:p2&...`,
    which its psycopg dialect hands to libpq as host=h1,h2 port=p1,p2. Any other URL as it is."""
    m = _MULTI_HOST.match(raw.strip())
    if m is None:
        return raw
    hosts = [h.strip() for h in m["hosts"].split(",") if h.strip()]
    rest = m["rest"] or "/"
    path, _, query = rest.partition("?")
    params = "&".join(f"host={quote(h, safe='[]:')}" for h in hosts)
    auth = f"{m['auth']}@" if m["auth"] is not None else ""
    return f"{m['scheme']}://{auth}{path or '/'}?{params}{'&' + query if query else ''}"


def render_url(url: sa.URL) -> str:
    """`url` as people read it, the password hidden: a multi-host URL's `host=h:p` unquoted."""
    return unquote(url.render_as_string(hide_password=True))
