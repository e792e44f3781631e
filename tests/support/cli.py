"""Run a `bgq` command as a test does: a one-shot command in this process, anything else as a real subprocess.

Starting a `bgq` process costs about half a second of CPU (the interpreter, SQLAlchemy and the
drivers); the suite runs a few hundred one-shot commands (monitor, process, pause, install-procs,
...), so `run_bgq` runs those through the same typer app in this process, with what a fresh process
would have: a clean BGQ_* environment, the app's directory on sys.path, the command's own stdout,
stderr and exit code, stderr logging as `logfmt.use` sets it up, and a traceback on stderr for an
exception the CLI let out (so "no Traceback" assertions still mean something). The commands that
live on (work, consume, web, demo) or that a test signals or runs concurrently go through
`subprocess`, as does any call with `real=True`.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from bgq import logfmt
from bgq.cli import commands as cli

BGQ = shutil.which("bgq", path=str(Path(sys.executable).parent)) or str(Path(sys.executable).parent / "bgq")

#: Commands that run to their end and leave nothing behind: safe to run in the test's process.
ONE_SHOT = frozenset(
    {
        "install-procs", "process", "requeue", "reload-consumers", "monitor", "workers",
        "clear-finished", "pause", "resume", "cancel", "schedules", "sql",
    }
)  # fmt: skip


def bgq_vars(env: dict[str, str]) -> dict[str, str]:
    """The BGQ_* variables of an environment: what run_bgq's `env` takes."""
    return {k: v for k, v in env.items() if k.startswith("BGQ_")}


def _command(args: tuple[str, ...]) -> str | None:
    """The subcommand's name: the first argument that is not an option or an option's value."""
    takes_value = {"--app", "--database-url", "--table", "--log-format"}
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in takes_value:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def run_bgq(
    *args: str,
    env: dict[str, str] | None = None,
    pythonpath: Path | str | None = None,
    cwd: Path | str | None = None,
    timeout: float = 120,
    real: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`bgq ARGS` with no BGQ_* variable but those in `env`; pythonpath goes first on the import path.
    `timeout` bounds a subprocess only: an in-process command runs to its end."""
    if real or _command(args) not in ONE_SHOT:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("BGQ_")}
        if pythonpath is not None:
            clean["PYTHONPATH"] = os.pathsep.join([str(pythonpath), clean.get("PYTHONPATH", "")]).rstrip(
                os.pathsep
            )
        clean.update(env or {})
        return subprocess.run(
            [BGQ, *args], capture_output=True, text=True, env=clean, cwd=cwd, timeout=timeout, check=False
        )
    return _in_process(args, env or {}, pythonpath, cwd)


def _in_process(
    args: tuple[str, ...], env: dict[str, str], pythonpath: Path | str | None, cwd: Path | str | None
) -> subprocess.CompletedProcess[str]:
    overrides: dict[str, str | None] = {k: None for k in os.environ if k.startswith("BGQ_")}
    overrides.update(env)
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in ("bgq", "pika")}
    root.handlers = []  # as in a new process: logfmt.use adds its stderr handler
    saved_path = sys.path[:]
    if pythonpath is not None:
        sys.path.insert(0, str(pythonpath))
    app_module = _app_module(args, overrides)
    imported = sys.modules.pop(app_module, None) if app_module else None  # a fresh import, as a new process
    before = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = CliRunner().invoke(
            cli.app, list(args), env=overrides, catch_exceptions=True, prog_name="bgq"
        )
    finally:
        os.chdir(before)
        sys.path[:] = saved_path
        _reset_cli_state()
        if app_module:
            fresh = sys.modules.pop(app_module, None)
            if fresh is not None and fresh is not imported and callable(getattr(fresh, "dispose", None)):
                fresh.dispose()  # a test app's own engines (tests/support/work_app.py's ledger)
            if imported is not None:
                sys.modules[app_module] = imported
        if logfmt._handler is not None:
            root.removeHandler(logfmt._handler)
            logfmt._handler = None
        root.handlers, root.level = saved_handlers, saved_level
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert result.exc_info is not None
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return subprocess.CompletedProcess(["bgq", *args], result.exit_code, result.stdout, stderr)


def _app_module(args: tuple[str, ...], env: dict[str, str | None]) -> str | None:
    """The module --app (or BGQ_APP) names: imported afresh by each command, as in a new process."""
    spec = env.get("BGQ_APP")
    for option, value in zip(args, args[1:], strict=False):
        if option == "--app":
            spec = value
    return spec.partition(":")[0] or None if spec else None


def _reset_cli_state() -> None:
    """Close what the command opened and forget it, as the end of a process would."""
    state: Any = cli.state
    if state.queue is not None:
        state.queue.close()
    if state.database is not None:
        state.database.dispose()
    cli.state = cli.State()
