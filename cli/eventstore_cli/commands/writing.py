"""Commands that write to the store: migrate, append, recover and erase."""

from __future__ import annotations

import typer

from ..database import open_store, sqlite_file
from ..errors import cli_errors, usage
from ..inputs import read_actions
from ..options import SESSION, JsonOpt
from ..output import print_json
from ..terminal import safe

__all__ = ["migrate", "append", "recover", "erase"]


@cli_errors
def migrate(ctx: typer.Context) -> None:
    """Create the schema, or upgrade it to the newest revision.

    Creates the database itself when it is a SQLite file that does not exist yet. Safe
    to run any number of times; every other command needs a migrated database. Says
    what it did: created, upgraded, or nothing to do.
    """
    from eventstore import SchemaError

    url = ctx.obj["db"]
    path = sqlite_file(url)
    new_file = path is not None and not path.exists()
    with open_store(ctx, create=True) as store:
        try:
            store.check_schema()
        except SchemaError:
            store.migrate()
            done = "created the database and its schema" if new_file else "migrated the schema to the newest revision"
        else:
            done = "the schema is already up to date; nothing to do"
        shown = store.url
    typer.echo(f"{done} ({safe(shown)})")


@cli_errors
def append(
    ctx: typer.Context,
    session: str = typer.Argument(..., metavar=SESSION, help="The session to append to (created when new)."),
    file: str = typer.Argument("-", metavar="FILE", help="A JSON array of actions or JSON Lines; '-' = stdin."),
    expected_version: int | None = typer.Option(
        None,
        "--expected-version",
        "-e",
        min=0,
        help="Refuse unless the head is this version (0 = the session must not exist yet).",
    ),
    actor: str | None = typer.Option(None, "--actor", help="Who recorded these events."),
    as_json: bool = JsonOpt,
) -> None:
    """Append chat actions to a session as one atomic batch.

    Input is a JSON array of actions, a single action object, or JSON Lines. An action is
    one of send {"type":"send","id","text"}, part {"type":"part","part":{...},"within"?},
    toolPhase {"type":"toolPhase","name","state","prompt"?}, stop, retry or reset. Nothing
    is written when any action is malformed or the expected version does not match.

    Input JSON is strict: a key repeated within one object is refused. A new session id
    must not end in '@' and digits (it would read as SESSION@VERSION).

    Example: echo '{"type":"send","id":"u-1","text":"hi"}' | eventstore append s1 -
    """
    actions = read_actions(file)
    with open_store(ctx) as store:
        r = store.append(session, actions, expected_version=expected_version, actor=actor)
    if as_json:
        print_json(r.to_json())
    else:
        typer.echo(f"appended {len(actions)} event(s) to {safe(session)}: head is now {r.version}")


@cli_errors
def recover(
    ctx: typer.Context,
    session: str = typer.Argument(
        ..., metavar=SESSION, help="The session whose streaming turn may have died."
    ),
    stale_after: float = typer.Option(
        30.0,
        "--stale-after",
        help="Seconds without a write (or lease renewal) after which the writer counts as dead.",
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Close a streaming turn whose writer died, and print the continuation seed.

    When the session is still streaming and no turn in any process has written to it for
    --stale-after seconds, appends an interruption error part (every open tool call is
    cancelled) and prints the messages a continuation sends the model. A live writer is
    never interrupted: then nothing is written.
    """
    with open_store(ctx) as store:
        r = store.recover(session, stale_after=stale_after)
        why = store.recovery_status(session, stale_after=stale_after) if r is None else None
    if as_json:
        print_json(None if r is None else r.to_json())
    elif r is None:
        assert why is not None
        typer.echo(f"nothing to recover in {safe(session)}: {safe(why.message())}")
    else:
        typer.echo(
            f"recovered {safe(session)}: interrupted at version {r.version}; "
            f"{len(r.messages)} message(s) to continue from"
        )


@cli_errors
def erase(
    ctx: typer.Context,
    session: str | None = typer.Argument(None, metavar=SESSION, help="The session to erase, with its branches."),
    reason: str | None = typer.Option(None, "--reason", help="Why (kept in the tombstone); required for a SESSION."),
    actor: str | None = typer.Option(None, "--actor", help="Who is erasing (kept in the tombstone)."),
    older_than: str | None = typer.Option(
        None, "--older-than", help="Instead of a SESSION: every session whose last event is older (90d, 12h, 2w)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="With --older-than: only list what would be erased."),
    as_json: bool = JsonOpt,
) -> None:
    """Erase a session and every branch forked from it (their content is deleted; a
    tombstone with who, when and why remains), or every session older than an age."""
    if (session is None) == (older_than is None):
        usage("give a SESSION or --older-than AGE (not both)")
    if dry_run and older_than is None:
        usage("--dry-run goes with --older-than")
    with open_store(ctx) as store:
        if session is not None:
            if reason is None:
                usage("--reason is required: say why the session is erased")
            ids = store.erase(session, reason=reason, actor=actor)
        else:
            assert older_than is not None  # one of the two, checked above
            ids = store.erase_older_than(
                older_than, reason=reason or f"retention: older than {older_than}", actor=actor, dry_run=dry_run
            )
    if as_json:
        print_json({"erased": [] if dry_run else ids, "would_erase": ids if dry_run else []})
        return
    verb = "would erase" if dry_run else "erased"
    for sid in ids:
        typer.echo(f"{verb} {safe(sid)}")
    typer.echo(f"{len(ids)} session(s) {verb.split()[-1] if dry_run else verb}{' (dry run)' if dry_run else ''}")
