"""The command line: the `bgq` command and what only it runs (the demo, the supervisor, command locks)."""

from .commands import main  # the console script `bgq = "bgq.cli:main"`

__all__ = ["main"]
