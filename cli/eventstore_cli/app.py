"""The ``eventstore`` command: a thin Typer layer over the public eventstore API.

This module holds the command group, its global options, the table of commands (in the
order ``--help`` lists them) and the entry point. The commands themselves live in
:mod:`.commands`, one module per family; each opens the store, calls one library function
and renders the result (human output with Rich, or one JSON document with ``--json``).
Library errors become one ``error: …`` line on stderr and exit code 1 (a JSON object with
``--json``, see :mod:`.errors`); usage errors (conflicting options) exit 2. Rendering
lives in :mod:`.render` and :mod:`.listing`; every stored value is made terminal-safe by
:mod:`.terminal` on its way out.

Start-up matters for a command line: this module imports only Typer and the CLI's own
small modules. The library, Rich and the renderers are imported inside the commands
that need them, so ``eventstore --help`` never loads SQLAlchemy or pydantic.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperGroup

from .commands import audit, explore, following, reading, time_travel, transfer, writing
from .database import DEFAULT_URL
from .errors import emit_error, json_mode

__all__ = ["app", "main", "COMMANDS"]


class _Group(TyperGroup):
    """The command group: the global ``--db`` may also follow the command's name."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, _db_first(args))


def _db_first(args: list[str]) -> list[str]:
    """``args`` with every ``--db URL`` given after the command moved before it."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] == "--db" else 1
    moved: list[str] = []
    rest: list[str] = []
    j = i + 1
    while j < len(args):
        a = args[j]
        if a == "--":
            rest.extend(args[j:])
            break
        if a == "--db" and j + 1 < len(args):
            moved += args[j : j + 2]
            j += 2
            continue
        if a.startswith("--db="):
            moved.append(a)
        else:
            rest.append(a)
        j += 1
    return args[:i] + moved + args[i : i + 1] + rest


app = typer.Typer(
    name="eventstore",
    cls=_Group,
    help=(
        "Event-sourced AI chat sessions on SQLite or PostgreSQL, with time travel.\n\n"
        "Every action of a chat (a user message, a streamed part, a tool phase, a stop, a retry) "
        "is one immutable event. Load any version, fork a session at any turn, compare two "
        "paths, fold old history into a baseline, and audit what happened.\n\n"
        "Refs are SESSION or SESSION@VERSION (version 0 is the empty state); a session id may "
        "itself contain '@' (ada@example.com). --db may also follow the command's name. "
        "Try `eventstore demo` first."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"eventstore {version('eventstore')}")
        raise typer.Exit()


@app.callback()
def _global(
    ctx: typer.Context,
    db: str = typer.Option(
        DEFAULT_URL,
        "--db",
        envvar="EVENTSTORE_URL",
        metavar="URL",
        help="Database URL (SQLAlchemy form): sqlite:///file.db or "
        "postgresql+psycopg://user:pw@host/db. Env: EVENTSTORE_URL.",
        show_default=True,
    ),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Event-sourced AI chat sessions with time travel."""
    ctx.obj = {"db": db}


#: Every command, in the order ``eventstore --help`` lists them, with the function that
#: runs it (see the family modules in :mod:`.commands`).
COMMANDS: tuple[tuple[str, Callable[..., None]], ...] = (
    ("migrate", writing.migrate),
    ("append", writing.append),
    ("sessions", reading.sessions),
    ("info", reading.info),
    ("history", reading.history),
    ("checkout", reading.checkout),
    ("branch", time_travel.branch),
    ("rewind", time_travel.rewind),
    ("diff", time_travel.diff),
    ("compact", time_travel.compact),
    ("replay", time_travel.replay),
    ("verify", audit.verify),
    ("recover", writing.recover),
    ("keygen", audit.keygen),
    ("checkpoint", audit.checkpoint_cmd),
    ("erase", writing.erase),
    ("export", transfer.export_cmd),
    ("import", transfer.import_cmd),
    ("demo", explore.demo),
    ("report", audit.report),
    ("ui", explore.ui),
    ("tail", following.tail),
    ("feed", following.feed_cmd),
)
for _name, _run in COMMANDS:
    app.command(_name)(_run)


def main() -> None:
    """Console-script entry point: under ``--json`` usage errors too are JSON objects."""
    as_json = "--json" in sys.argv[1:]
    # A command imports several hundred modules before it touches any data; the cyclic
    # collector's passes over those import-time objects are about a tenth of a short
    # command's CPU. It is switched back on once the store is open (see open_store).
    gc.disable()
    try:
        code = app(standalone_mode=False)
    except typer.Abort:
        emit_error("Interrupted", "interrupted")
        sys.exit(130)
    except Exception as exc:
        # Typer's own usage errors (a missing argument, an unknown option) are click
        # exceptions; whichever click Typer ships, they carry these three members.
        exit_code = getattr(exc, "exit_code", None)
        message = getattr(exc, "format_message", None)
        show = getattr(exc, "show", None)
        if not isinstance(exit_code, int) or message is None or show is None:
            raise
        if as_json:
            json_mode(True)
            emit_error("UsageError" if exit_code == 2 else type(exc).__name__, message())
        else:
            show()
        sys.exit(exit_code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
