"""Commands that print events as they are committed: tail and feed."""

from __future__ import annotations

import sys
from typing import Any

import typer

from ..database import open_store
from ..errors import cli_errors
from ..terminal import json_text, safe

__all__ = ["tail", "feed_cmd"]


def _event_line(e: Any, with_position: bool) -> str:
    """One event as one human line: [position] when, session@version, type, actor, summary
    (stored text made terminal-safe)."""
    from ..summary import action_summary, short_time

    where = f"{e.position}  " if with_position else ""
    actor = f"  {e.actor}" if e.actor else ""
    return safe(
        f"{where}{short_time(e.recorded_at)}  {e.session_id}@{e.version}  {e.type}{actor}  "
        f"{action_summary(e.action)}"
    )


def _close_when_reader_leaves(events: Any) -> None:
    """When stdout is a pipe, close ``events`` as soon as its reader goes away — also while
    the follower waits for a new event and has nothing to write (``tail --follow | head -1``
    would otherwise wait for the next commit to notice)."""
    import os
    import select
    import stat
    import threading

    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
    except (OSError, ValueError, AttributeError):
        return

    def watch() -> None:
        p = select.poll()
        p.register(fd, 0)  # POLLERR / POLLHUP are always reported: the read end closed
        p.poll()
        events.close()

    threading.Thread(target=watch, name="eventstore-stdout-watch", daemon=True).start()


def _stream_events(events: Any, as_json: bool, with_position: bool) -> None:
    """Print events as they come, one line each (JSON Lines with ``--json``), flushed at
    once. Ctrl-C and a reader that went away (``| head -1``) end it quietly with exit 0."""
    import os

    _close_when_reader_leaves(events)
    try:
        for e in events:
            line = json_text(e.to_json(), indent=None) if as_json else _event_line(e, with_position)
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    finally:
        events.close()


@cli_errors
def tail(
    ctx: typer.Context,
    session: str = typer.Argument(..., help="The session to show (a branch includes its inherited prefix)."),
    after: int = typer.Option(0, "--after", min=0, help="Only events after this version."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new events as they are committed."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line (JSON Lines)."),
) -> None:
    """Print a session's events after a version, one line each; with --follow, keep
    printing each new event as soon as it is committed (Ctrl-C to stop).

    Example: eventstore tail s1 --after 40 --follow --json | jq .type
    """
    with open_store(ctx) as store:
        _stream_events(store.follow(session, after=after, idle_timeout=None if follow else 0), as_json, False)


@cli_errors
def feed_cmd(
    ctx: typer.Context,
    after: str | None = typer.Option(
        None, "--after", metavar="POSITION", help="Resume right after this position (from an earlier line)."
    ),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new events as they are committed."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line (JSON Lines)."),
) -> None:
    """Print the events of every session in feed order, each with its position; with
    --follow, keep printing new ones as they are committed (Ctrl-C to stop).

    Store the position of the last line handled and pass it to --after to resume exactly
    after it: no event is skipped or repeated, and each session's events come in version
    order.
    """
    with open_store(ctx) as store:
        _stream_events(store.feed(after=after, idle_timeout=None if follow else 0), as_json, True)
