"""Runs one claimed job's callback with its hooks and maps what happened to the job's outcome."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import Config
from ..errors import (
    BackgroundQueueException,
    DieException,
    PermanentErrorException,
    SkipException,
    WaitingException,
)
from ..model import JobState, Outcome
from . import coroutines


def backoff_ms(attempts: int) -> int:
    """Delay before retry number `attempts`: min(16, 2^(attempts-1)) minutes (attempts 0: 30 s)."""
    return int(min(16.0, 2.0 ** (min(attempts, 5) - 1)) * 60_000)


def invoke(func: Callable[..., Any], parameters: Any) -> Any:
    """Call the callback: a list or tuple as positional arguments, a dict as keyword arguments.

    A coroutine function (`async def`) is awaited on the process's reused event loop (coroutines.py)."""
    if isinstance(parameters, dict):
        return coroutines.resolve(func(**parameters))
    return coroutines.resolve(func(*parameters))


def describe(exc: BaseException) -> str:
    """The error_message stored for an exception: its message, with the type for non-bgq errors."""
    text = str(exc)
    if isinstance(exc, BackgroundQueueException):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def classify(exc: BaseException, attempt: int, config: Config) -> Outcome:
    """SPEC B §6: the first matching rule wins. `exc` is already the one after on_error."""
    die = False
    if isinstance(exc, DieException):
        die = True
        if exc.__cause__ is not None:
            exc = exc.__cause__
        else:
            return Outcome(JobState.PERMANENTLY_FAILED, describe(exc), exception=exc, die=True)
    if isinstance(exc, SkipException):
        return Outcome(JobState.FINISHED, describe(exc), exception=exc, die=die)
    if isinstance(exc, (PermanentErrorException, DieException, *config.permanent_errors)):
        return Outcome(JobState.PERMANENTLY_FAILED, describe(exc), exception=exc, die=die)
    if isinstance(exc, WaitingException):
        return Outcome(JobState.FINISHED, describe(exc), exception=exc, die=die, clone=True)
    return Outcome(
        JobState.TEMPORARILY_FAILED, describe(exc), postponed_by=backoff_ms(attempt), exception=exc, die=die
    )


def run(func: Callable[..., Any], parameters: Any, attempt: int, config: Config) -> Outcome:
    """Run on_before_process, the callback and on_after_process; map any exception (via on_error).

    Any of them may be a coroutine function: it is awaited on the process's event loop (coroutines.py)."""
    try:
        if config.on_before_process is not None:
            coroutines.resolve(config.on_before_process(parameters))
        before = memory_usage(reset_peak=True)
        started = time.perf_counter()
        invoke(func, parameters)
        elapsed = int((time.perf_counter() - started) * 1000)
        after = memory_usage()
        if config.on_after_process is not None:
            coroutines.resolve(config.on_after_process(parameters))
        return Outcome(JobState.FINISHED, execution_time=elapsed, memory={"before": before, "after": after})
    except Exception as exc:
        error: BaseException = exc
        if config.on_error is not None:
            try:
                coroutines.resolve(config.on_error(exc, parameters))
            except Exception as replaced:  # as in the original: on_error's exception replaces the job's
                error = replaced
        return classify(error, attempt, config)


def memory_usage(*, reset_peak: bool = False) -> dict[str, int | None]:
    """Resident set size and its peak, in bytes (Linux /proc; None elsewhere).

    With reset_peak the kernel's peak (VmHWM) is reset first, so `after.peak_rss` is the job's peak.
    Runs twice per job, so /proc/self/status and /proc/self/clear_refs stay open (per process: a
    forked child opens its own) and are read and written at offset 0, which makes the kernel
    produce the file afresh: a text-mode open() and a line loop per call cost some 100 us.
    """
    files = _proc_files()
    if reset_peak and files.clear_refs is not None:
        try:
            if os.fstat(files.clear_refs).st_ino == files.clear_refs_inode:  # still ours
                os.pwrite(files.clear_refs, b"5", 0)
        except OSError:
            pass
    if files.status is None:
        return {"rss": None, "peak_rss": None}
    try:
        status = os.pread(files.status, 65536, 0)
    except OSError:
        status = b""
    rss, peak = _status_kib(status, b"\nVmRSS:"), _status_kib(status, b"\nVmHWM:")
    if rss is None:  # not our status file any more (closed behind our back?): open it again
        _PROC_FILES.pop(os.getpid(), None)
    return {"rss": rss, "peak_rss": peak}


@dataclass(frozen=True)
class _ProcFiles:
    status: int | None  # file descriptors (None: not available)
    clear_refs: int | None
    clear_refs_inode: int


_PROC_FILES: dict[int, _ProcFiles] = {}  # by process id
_PROC_LOCK = threading.Lock()


def _proc_files() -> _ProcFiles:
    files = _PROC_FILES.get(os.getpid())
    if files is not None:
        return files
    with _PROC_LOCK:
        pid = os.getpid()
        files = _PROC_FILES.get(pid)
        if files is None:
            status = clear_refs = None
            inode = -1
            with contextlib.suppress(OSError):
                status = os.open("/proc/self/status", os.O_RDONLY)
            with contextlib.suppress(OSError):
                clear_refs = os.open("/proc/self/clear_refs", os.O_WRONLY)
                inode = os.fstat(clear_refs).st_ino
            _PROC_FILES.clear()  # a forked child's copies of its parent's descriptors stay open
            files = _PROC_FILES[pid] = _ProcFiles(status, clear_refs, inode)
        return files


def _status_kib(status: bytes, key: bytes) -> int | None:
    """The value of a '<key> <n> kB' line of /proc/self/status, in bytes (None: no such line)."""
    start = status.find(key)
    if start < 0:
        return None
    end = status.find(b"\n", start + len(key))
    fields = status[start + len(key) : end if end >= 0 else len(status)].split()
    return int(fields[0]) * 1024 if fields and fields[0].isdigit() else None
