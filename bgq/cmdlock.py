"""Per-host command locking (SPEC B §10): one `bgq process` (monitor, clear-finished, ...) at a time.

The lock is an flock(2) on `<locks dir>/<name>.lock`. The kernel releases it when the holder's
file descriptor closes, also when the process is killed, so a stale lock cannot exist: the next
run simply takes it. The holder writes its pid into the file for people (`cat` it); the pid is
never used to decide anything. The file is never deleted: deleting a lock file that another
process has already opened would let two processes hold "the" lock at once.

The locks directory is $BGQ_LOCKS_DIR, default ~/.cache/bgq/locks. It must be on a local file
system (flock on NFS is not reliable everywhere). The lock is per host only, as in the original.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from types import TracebackType

from .errors import BgqError

_UNSAFE = re.compile(r"[^-a-zA-Z0-9_.]")
_MAX_NAME = 120


class CommandLockedError(BgqError):
    """The command is already running on this host."""

    def __init__(self, name: str, path: Path, pid: int | None) -> None:
        holder = f" (pid {pid})" if pid else ""
        super().__init__(f"{name} is already running on this host{holder}.")
        self.name = name
        self.path = path
        self.pid = pid


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
            pid = _read_pid(fd)
            os.close(fd)
            raise CommandLockedError(self.name, self.path, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
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


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
