"""Job ids published inside an application transaction, held until its outermost commit.

A job inserted on the application's SQLAlchemy Session or Connection must not reach the broker
before the row is committed (a consumer would find no row), and must never reach it if the
transaction rolls back. The outbox keeps the ids per Session/Connection, sends them after the
outermost commit, drops them on rollback, and drops the ids of a rolled-back savepoint only. A
Session that joined a transaction of the application's Connection hands its ids to that
Connection's outbox when it commits: the Connection's commit is the outermost one.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeGuard

from sqlalchemy import event
from sqlalchemy.engine import Connection

from ..model import Message

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

_boxes: weakref.WeakKeyDictionary[Any, _Outbox] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Pending:
    job_id: int
    queue: str
    priority: int
    delay_ms: int | None
    scope: Any  # the innermost transaction or savepoint it was published in


Send = Callable[[list[Pending]], None]


def is_session(target: object) -> TypeGuard[Session]:
    """Whether `target` is a SQLAlchemy ORM Session. bgq itself never imports the ORM (a third of
    SQLAlchemy's import time, paid by every `bgq` command): an application that passes a Session
    has imported it already."""
    orm = sys.modules.get("sqlalchemy.orm")
    return orm is not None and isinstance(target, orm.Session)


def add(target: Session | Connection, message: Message, send: Send) -> None:
    """Hold one job id on `target` until its outermost commit; `send` receives the ids then."""
    box = _outbox(target, send)
    box.items.append(Pending(*message, scope=box.current_scope()))


class _Outbox:
    def __init__(self, target: Session | Connection, send: Send) -> None:
        self.target = target
        self.send = send
        self.items: list[Pending] = []
        self.savepoints: list[object] = []  # Connection only: a marker per open savepoint, innermost last

    def current_scope(self) -> Any:
        if is_session(self.target):
            return self.target.get_nested_transaction() or self.target.get_transaction()
        return tuple(self.savepoints)

    def flush(self) -> None:
        items, self.items = self.items, []
        if items:
            self.send(items)

    def drop(self, rolled_back: Any = None) -> None:
        """Forget every id, or only those published inside `rolled_back` (a savepoint)."""
        if rolled_back is None:
            self.items = []
        else:
            self.items = [i for i in self.items if not _inside(i.scope, rolled_back)]


def _inside(scope: Any, rolled_back: Any) -> bool:
    if isinstance(rolled_back, tuple):  # Connection savepoints: a prefix of the stack
        return bool(scope[: len(rolled_back)] == rolled_back)
    while scope is not None:  # SessionTransaction: walk up to the root
        if scope is rolled_back:
            return True
        scope = scope.parent
    return False


def _open_savepoints(conn: Connection) -> int:
    """How many savepoints (begin_nested) are open on `conn`. SQLAlchemy links each to the one
    it was opened inside, and names only the innermost publicly."""
    depth, nested = 0, conn.get_nested_transaction()
    while nested is not None:
        depth += 1
        nested = getattr(nested, "_previous_nested", None)
    return depth


def _outbox(target: Session | Connection, send: Send) -> _Outbox:
    # Keyed by the Session or Connection object itself: a Connection's .info belongs to the pooled
    # DBAPI connection and outlives it, while the listeners below belong to this object.
    box = _boxes.get(target)
    if box is not None:
        box.send = send
        return box
    box = _Outbox(target, send)
    _boxes[target] = box
    if isinstance(target, Connection):  # savepoints opened before this first publish count too
        box.savepoints = [object() for _ in range(_open_savepoints(target))]
    if is_session(target):

        def after_commit(session: Session) -> None:
            # SQLAlchemy fires after_commit for a released savepoint (begin_nested) too: then the
            # committing transaction is still the session's nested one, and its ids wait.
            if session.get_nested_transaction() is not None:
                return
            bind = session.bind
            if isinstance(bind, Connection) and bind.in_transaction():
                # The Session joined a transaction of a Connection the application owns
                # (join_transaction_mode): its commit only ended its part. The ids wait for that
                # Connection's own commit, and go with its rollback.
                items, box.items = box.items, []
                outer = _outbox(bind, box.send)
                scope = outer.current_scope()
                outer.items.extend(replace(i, scope=scope) for i in items)
                return
            box.flush()

        event.listen(target, "after_commit", after_commit)

        # after_soft_rollback fires for every rollback, a savepoint's included (after_rollback
        # would fire for a savepoint too and cannot tell which transaction ended).
        def soft_rollback(session: Session, previous: Any) -> None:
            if previous.nested:
                box.drop(previous)
            elif previous.parent is None:
                box.drop()

        event.listen(target, "after_soft_rollback", soft_rollback)
    else:

        def commit(conn: Connection) -> None:
            # SQLAlchemy fires "commit" before it commits, and has no event after it: commit the
            # DBAPI connection here first (SQLAlchemy's own COMMIT then finds nothing to do), so
            # no consumer can ever receive an id whose row is not committed yet.
            dbapi = conn.connection.dbapi_connection
            assert dbapi is not None  # a connection that is committing holds its DBAPI connection
            dbapi.commit()
            box.savepoints.clear()
            box.flush()

        # SQLAlchemy names a savepoint only after firing "savepoint" (the name is None there), and
        # savepoints end innermost first: track them by depth, each a fresh marker.
        def savepoint(conn: Connection, name: str | None) -> None:
            box.savepoints.append(object())

        def rollback_savepoint(conn: Connection, name: str, context: Any) -> None:
            if box.savepoints:
                box.drop(tuple(box.savepoints))
                box.savepoints.pop()

        def release_savepoint(conn: Connection, name: str, context: Any) -> None:
            if box.savepoints:
                released = tuple(box.savepoints)
                box.savepoints.pop()
                parent = tuple(box.savepoints)
                box.items = [replace(i, scope=parent) if _inside(i.scope, released) else i for i in box.items]

        def rollback(conn: Connection) -> None:
            box.savepoints.clear()
            box.drop()

        event.listen(target, "commit", commit)
        event.listen(target, "rollback", rollback)
        event.listen(target, "savepoint", savepoint)
        event.listen(target, "rollback_savepoint", rollback_savepoint)
        event.listen(target, "release_savepoint", release_savepoint)
    return box
