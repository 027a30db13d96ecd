"""A warm `eventstore` program for the CLI tests: imported once, forked once per run.

Starting the real program costs most of a short command's CPU (Python, Typer, Rich,
SQLAlchemy and eventstore imported afresh), and the CLI tests run it several hundred
times. This process imports all of that once, then for each request forks a child that
is a fresh run of the program in every way a test can observe: its own process, argv,
environment, working directory, stdin, stdout and stderr (files the caller names), and
exit status; it runs the console script's own ``sys.exit(main())`` and ends with the
interpreter's normal shutdown. The program reads no environment at import time, so
importing it before the environment is set changes nothing. What a child does not
repeat is the interpreter's start and the console-script file itself: tests that pass
``real=True`` to ``cli_helpers.run_cli`` (one per command family) run the real program.

Protocol (``cli_helpers`` speaks it): one JSON request per line on the file descriptor
REQUESTS, holding ``argv``, ``env``, ``cwd``, and the ``stdin``/``stdout``/``stderr`` file
paths; for each, a line ``{"pid": N}`` on REPLIES when the child starts, then
``{"status": CODE}`` (a ``subprocess``-style return code) when it ends.

    python tests/cli_server.py EXE REQUESTS REPLIES
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any

#: Modules commands import lazily (found by diffing sys.modules around a run): imported
#: here once. A name that no longer exists is skipped: warming only saves time.
LAZY = (
    "eventstore_cli.app",
    "rich.console",
    "rich.table",
    "typer._adapters",
    "typer._click.decorators",
    "pydantic.plugin._loader",
    "sqlite3",
    "sqlalchemy.dialects.sqlite.pysqlite",
    "sqlalchemy.dialects.postgresql.psycopg",
    "eventstore.storage.sqlite",
    "eventstore.storage.postgres",
    "alembic.command",
    "alembic.config",
    "argparse",
    "importlib.resources.readers",
    "alembic.autogenerate",
    "alembic.ddl.postgresql",
    "alembic.ddl.sqlite",
)

def _warm() -> None:
    """Import what every command imports, so that no child does."""
    import eventstore

    for name in eventstore.__all__:
        getattr(eventstore, name)
    for module in LAZY:
        try:
            importlib.import_module(module)
        except ImportError:
            pass


def _reply(replies: int, doc: dict[str, Any]) -> None:
    os.write(replies, (json.dumps(doc) + "\n").encode())


def _requests(requests: int) -> Any:
    """Each request line from ``requests``, until the caller closes it."""
    pending = b""
    while True:
        chunk = os.read(requests, 65536)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            yield json.loads(line)


def serve(requests: int, replies: int) -> dict[str, Any]:
    """Answer requests; return only in a forked child, with the request it must run."""
    for request in _requests(requests):
        pid = os.fork()
        if pid == 0:
            os.close(requests)
            os.close(replies)
            return request
        _reply(replies, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _reply(replies, {"status": os.waitstatus_to_exitcode(status)})
    sys.exit(0)


def become(request: dict[str, Any]) -> None:
    """Turn this forked child into the run ``request`` describes."""
    for fd, key, flags in (
        (0, "stdin", os.O_RDONLY),
        (1, "stdout", os.O_WRONLY | os.O_TRUNC | os.O_CREAT),
        (2, "stderr", os.O_WRONLY | os.O_TRUNC | os.O_CREAT),
    ):
        opened = os.open(request[key], flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])


if __name__ == "__main__":
    # The console script's directory is its sys.path[0], not this file's (tests/).
    sys.path[0] = os.path.dirname(sys.argv[1])
    _warm()
    # Nothing is written to the standard streams before a fork, so each child's
    # sys.stdout and sys.stderr start empty, on the files dup2 put behind them.
    become(serve(int(sys.argv[2]), int(sys.argv[3])))
    from eventstore_cli.app import main

    sys.exit(main())  # type: ignore[func-returns-value]
