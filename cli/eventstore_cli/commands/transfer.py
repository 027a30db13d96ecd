"""Commands that move sessions between databases: export and import."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from ..database import open_store
from ..errors import cli_errors
from ..options import SESSION, JsonOpt
from ..output import print_json, progress_bar
from ..terminal import safe

__all__ = ["export_cmd", "import_cmd"]


@cli_errors
def export_cmd(
    ctx: typer.Context,
    session: str = typer.Argument(..., metavar=SESSION, help="The session to export."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),
) -> None:
    """Write a session as JSON Lines: lossless (ids, versions, timestamps, actors,
    metadata, hashes, branch links, baseline).

    A branch's file also carries the sessions it descends from, so `eventstore import`
    recreates it anywhere — on SQLite or PostgreSQL — with identical history and hashes.
    """
    with open_store(ctx) as store, progress_bar() as bar:
        task = bar.add_task(f"exporting {safe(session)}", total=None)

        def tick(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        if output is None:
            import io

            buf = io.StringIO()
            n = store.export(session, buf, progress=tick)
            sys.stdout.write(buf.getvalue())
            sys.stdout.flush()
        else:  # the library writes PATH.part and renames it when complete
            n = store.export(session, output, progress=tick)
    if output is not None:
        typer.echo(f"exported {n} event(s) of {safe(session)} to {safe(output)}", err=True)


@cli_errors
def import_cmd(
    ctx: typer.Context,
    file: str = typer.Argument(
        ..., metavar="FILE", help="A file written by `eventstore export` (or an archive); '-' = stdin."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Recreate sessions from an export (or compaction archive) file, verbatim.

    Event ids, versions, timestamps, actors, metadata and hashes are kept exactly; the
    hash chain is checked first and a tampered file is refused with nothing written.
    Sessions already present with the same history are left as they are.
    """
    with open_store(ctx) as store, progress_bar() as bar:
        task = bar.add_task("importing", total=None)

        def tick(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        if file == "-":
            results = store.import_(sys.stdin, progress=tick)
        else:
            with open(file, encoding="utf-8") as fh:
                results = store.import_(fh, progress=tick)
    if as_json:
        print_json([r.to_json() for r in results])
    else:
        for r in results:
            typer.echo(f"{safe(r.session)}: {r.status} ({r.events} event(s), head {r.head})")
