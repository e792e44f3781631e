"""Per-host command locking (SPEC B §10): one `bgq process` (monitor, clear-finished, ...) at a time.

The lock is an flock(2) on `<locks dir>/<name>.lock`. The kernel releases it when the holder's
file descriptor closes, also when the process is killed, so the lock of a dead holder cannot
exist: the next run simply takes it. The holder writes its pid and start time into the file
(`cat` it: "<pid> <unix time> <UTC time>"); only the flock decides who holds the lock, the file's
text only says who that is and since when. A holder that is alive but hung (SIGSTOP, D-state
I/O) keeps the lock: `held_for()` / CommandLockedError.age tell how long, so the refused run and
`bgq monitor` can report it. The file is never deleted: deleting a lock file that another process
has already opened would let two processes hold "the" lock at once.

The locks directory is $BGQ_LOCKS_DIR, default ~/.cache/bgq/locks. It must be on a local file
system (flock on NFS is not reliable everywhere). The lock is per host only, as in the original.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ..errors import BgqError

_UNSAFE = re.compile(r"[^-a-zA-Z0-9_.]")
_MAX_NAME = 120


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as its holder wrote it: pid and start (unix time); None when unknown."""

    pid: int | None
    started: float | None

    @property
    def age(self) -> float | None:
        """Seconds since the holder took the lock (None if it did not say when)."""
        return None if self.started is None else max(0.0, time.time() - self.started)


class CommandLockedError(BgqError):
    """The command is already running on this host."""

    def __init__(self, name: str, path: Path, holder: Holder) -> None:
        who = f" (pid {holder.pid})" if holder.pid else ""
        super().__init__(f"{name} is already running on this host{who}.")
        self.name = name
        self.path = path
        self.holder = holder
        self.pid = holder.pid

    @property
    def age(self) -> float | None:
        return self.holder.age


def locks_dir() -> Path:
    """$BGQ_LOCKS_DIR, else ~/.cache/bgq/locks."""
    configured = os.environ.get("BGQ_LOCKS_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "bgq" / "locks"


def lock_name(command: str, *scope: str) -> str:
    """A file-safe lock name: the command, its readable scope, and a hash of the whole scope.

    lock_name("process", "background_job", "default", url) -> "process-background_job-default-<hash>":
    different tables, queues or databases on one host never block each other.
    """
    readable = _UNSAFE.sub("-", "-".join((command, *scope[:2])))[:_MAX_NAME]
    digest = hashlib.sha256("\0".join((command, *scope)).encode()).hexdigest()[:12]
    return f"{readable}-{digest}"


class CommandLock:
    """An exclusive, non-blocking, per-host lock; use `command_lock(name)`."""

    def __init__(self, name: str, directory: Path | None = None) -> None:
        if not name or _UNSAFE.search(name) or name.startswith("."):
            raise ValueError(f"Invalid lock name {name!r}: use letters, digits, '-', '_' and '.'.")
        self.name = name
        self.directory = directory if directory is not None else locks_dir()
        self.path = self.directory / f"{name}.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise CommandLockedError at once (never waits)."""
        import fcntl  # POSIX only

        if self._fd is not None:
            raise RuntimeError(f"lock {self.name} is already held by this object")
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise CommandLockedError(self.name, self.path, holder) from None
        except BaseException:
            os.close(fd)
            raise
        now = time.time()
        stamp = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {now:.3f} {stamp}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        import fcntl

        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # no pid: nobody holds it
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> Holder | None:
        """Who holds the lock now (another process), or None if nobody does. Never waits.

        It probes with a shared flock, released at once: a run that starts in that instant is
        refused as if the lock were held (it exits 0 and the next run goes ahead).
        """
        import fcntl

        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read_holder(fd)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def __enter__(self) -> CommandLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def command_lock(name: str, directory: Path | None = None) -> CommandLock:
    """`with command_lock("process-..."):` runs the body only if no other process on this host
    holds the lock; otherwise CommandLockedError is raised before the body starts."""
    return CommandLock(name, directory)


def _read_holder(fd: int) -> Holder:
    """The holder's "<pid> <unix time> ..." line; what cannot be read is None (it may be
    mid-write, or written by an older bgq that wrote the pid alone)."""
    try:
        fields = os.pread(fd, 128, 0).decode(errors="replace").split()
    except OSError:
        return Holder(None, None)
    pid = int(fields[0]) if fields and fields[0].isdigit() else None
    try:
        started = float(fields[1]) if pid is not None and len(fields) > 1 else None
    except ValueError:
        started = None
    return Holder(pid, started)
