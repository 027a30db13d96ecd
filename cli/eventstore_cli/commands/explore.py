"""Commands to try the store and look around it: demo and ui (the explorer)."""

from __future__ import annotations

import typer

from ..database import open_store
from ..errors import cli_errors, fail
from ..terminal import console, safe

__all__ = ["demo", "ui"]


@cli_errors
def demo(ctx: typer.Context) -> None:
    """Record a sample conversation, branch it, and show history, checkout and diff.

    Runs on the database named by --db (default: the SQLite file ./eventstore.db, created
    when missing, so no setup is needed): migrates it, records a shopping-assistant chat (tool calls, a confirmation, a nested sub-agent, a network
    error and a retry) as session `demo` (`demo-2`, … when taken), forks it after the
    first turn into `<id>-alt` with a different second turn, then prints the turn view,
    the branch's state and the diff between the two paths.
    """
    from ..demo import run_demo

    with open_store(ctx, create=True) as store:
        run_demo(store, console())


@cli_errors
def ui(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback unless you say otherwise)."),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="TCP port to listen on."),
) -> None:
    """Serve the explorer: a local, read-only web app over the store.

    Browse the sessions (search, owner, status), read a session turn by turn at any
    version with a scrubber (arrow keys step), see its branches, kept lines and verify
    result, page through its events, compare two refs, and watch new events arrive live.
    There is NO authentication: anyone who can reach the port reads every session, so it
    listens on 127.0.0.1 unless --host says otherwise. Needs the ui extra
    (pip install 'eventstore[ui]'). Stop it with Ctrl-C.
    """
    try:
        from eventstore import serve_explorer
    except ModuleNotFoundError as exc:
        fail(f"the explorer needs the ui extra ({exc.name} is missing): pip install 'eventstore[ui]'")
    with open_store(ctx) as store:
        typer.echo(f"eventstore explorer on http://{safe(host)}:{port}/ (Ctrl-C stops it)", err=True)
        serve_explorer(store, host=host, port=port)
