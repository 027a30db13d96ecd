"""Commands that read sessions: sessions, info, history and checkout."""

from __future__ import annotations

import sys
from typing import Any

import typer

from ..database import open_store, parse_ref, resolve_version
from ..errors import cli_errors, usage
from ..options import REF, SESSION, JsonOpt
from ..output import print_json, terminal_width, working
from ..terminal import console, is_terminal, safe

__all__ = ["sessions", "info", "history", "checkout"]

#: Events ``history`` shows on a terminal unless told otherwise (--all, -n, --from).
PAGE = 100


@cli_errors
def sessions(
    ctx: typer.Context,
    owner: str | None = typer.Option(None, "--owner", help="Only this owner's sessions."),
    meta: list[str] = typer.Option([], "--meta", metavar="K=V", help="Only sessions whose metadata has K=V (repeatable)."),
    query: str | None = typer.Option(None, "--query", "-q", help="Only titles containing this (any case)."),
    status: str | None = typer.Option(None, "--status", help="idle, streaming, error or closed."),
    order: str | None = typer.Option(None, "--order", help="recent (newest activity first, default) or created."),
    limit: int | None = typer.Option(None, "--limit", "-n", help="Sessions per page, 1..1000 (default 50)."),
    cursor: str | None = typer.Option(None, "--cursor", help="The next page of an earlier listing."),
    as_json: bool = JsonOpt,
) -> None:
    """List sessions with head, parent, fork point and baseline, and the branch tree.

    With any of --owner, --meta, --query, --status, --order, --limit or --cursor: one page
    of the catalogue (title, owner, status, turns, last activity) and the cursor of the
    next page; --json then prints {"items": [...], "next_cursor": ...}.
    """
    if any(v is not None for v in (owner, query, status, order, limit, cursor)) or meta:
        from ..catalogue import catalogue_table, parse_meta

        metadata = parse_meta(meta)
        with open_store(ctx) as store:
            page = store.list_sessions(
                owner=owner,
                metadata=metadata or None,
                query=query,
                status=status,
                order=order or "recent",
                limit=50 if limit is None else limit,
                cursor=cursor,
            )
        if as_json:
            print_json(page.to_json())
        else:
            console().print(catalogue_table(page.items, page.next_cursor))
        return
    with open_store(ctx) as store:
        infos = list(store.sessions())
    if as_json:
        print_json([s.to_json() for s in infos])
        return
    if not infos:
        typer.echo("no sessions yet — try `eventstore demo` or `eventstore append`")
        return
    from .. import render

    out = console()
    out.print(render.sessions_table(infos))
    tree = render.branch_tree(infos)
    if tree is not None:
        out.print(tree)


@cli_errors
def info(
    ctx: typer.Context,
    session: str = typer.Argument(..., metavar=SESSION, help="The session."),
    title: str | None = typer.Option(None, "--title", help="Set the title ('' clears it)."),
    owner: str | None = typer.Option(None, "--owner", help="Set the owner."),
    meta: list[str] = typer.Option([], "--meta", metavar="K=V", help="Set the metadata to these pairs (repeatable; replaces it whole)."),
    actor: str | None = typer.Option(None, "--actor", help="Who makes the change (recorded)."),
    as_json: bool = JsonOpt,
) -> None:
    """Show a session's catalogue entry (title, owner, metadata, status) and its record of
    changes; with --title, --owner or --meta, set them first (no event is appended).

    Example: eventstore info s1 --title "Coffee mugs" --owner user:ada --meta tenant=acme
    """
    from ..catalogue import info_table, parse_meta

    metadata = parse_meta(meta)
    with open_store(ctx) as store:
        if title is not None or owner is not None or metadata:
            store.set_info(session, title=title, owner=owner, metadata=metadata or None, actor=actor)
        entry = store.info(session)
        changes = store.info_changes(session)
    if as_json:
        print_json({**entry.to_json(), "info_changes": [c.to_json() for c in changes]})
    else:
        console().print(info_table(entry, changes))


@cli_errors
def history(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar=REF, help="Session (optionally up to version V)."),
    turns: bool = typer.Option(
        False, "--turns", "-t", help="One row per turn: who, when, user text, tools, outcome."
    ),
    after: int | None = typer.Option(None, "--from", min=0, help="Only events after this version."),
    limit: int | None = typer.Option(None, "--limit", "-n", min=0, help="At most this many events."),
    last: bool = typer.Option(False, "--last", help="With --limit: the newest events instead of the oldest."),
    show_all: bool = typer.Option(
        False, "--all", "-a", help=f"Every event, even on a terminal (which shows {PAGE} at a time)."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Show the event log of a session, oldest first.

    A branch's history includes the prefix it inherited; the BY column names the session
    that recorded an inherited event. After a compaction the log starts at the baseline.
    --from, --limit and --last page through a long log (`history s1 -n 20 --last`: the
    newest 20 events). On a terminal, without --limit, the first 100 events are shown
    and a last line says how to see more; --all shows every event (piped output and
    --json always have every event). With --turns, one row per turn instead: actor,
    start and end time, the user's text, the assistant's reply, the tool calls with
    their final states, the outcome (idle / error / stopped) and retries.
    With --json, each recorded `info` change (who set the title, owner or metadata, and
    when) is listed among the events, after the event that was the head then
    ({"record": "info", "type": "set_info", "version", "recorded_at", "actor", "changes"}).
    """
    from eventstore import VersionNotFound

    session, version = parse_ref(ref)
    if turns and (after is not None or limit is not None or last or show_all):
        usage("--turns shows every turn; it takes no --from, --limit, --last or --all")
    if last and limit is None:
        usage("--last needs --limit N")
    if show_all and limit is not None:
        usage("give --all or --limit N, not both")
    paged = limit is None and not show_all and not as_json and is_terminal()
    with open_store(ctx) as store:
        if version is not None:
            head = store.head(session)
            if version > head:
                raise VersionNotFound(session, version, head)
        if turns:
            with working(f"reading the turns of {safe(session)}"):
                rows = store.turns(session, upto=version)
                kept = store.lines(session)
            if as_json:
                print_json([r.to_json() for r in rows])
            else:
                from .. import render

                out = console()
                out.print(render.turns_view(rows, session, width=out.width))
                if kept:
                    out.print(render.kept_lines(kept))
            return
        want = PAGE + 1 if paged else limit
        with working(f"reading the history of {safe(session)}"):
            events = list(store.history(session, after=after, upto=version, limit=want, desc=last))
            if last:
                events.reverse()  # shown oldest first either way
            if as_json:
                listing = _history_json(store, session, events, after, version)
    if as_json:
        print_json(listing)
        return
    more = paged and len(events) > PAGE
    if more:
        events = events[:PAGE]
    from ..listing import history_lines

    lines = history_lines(events, session, terminal_width())
    sys.stdout.write("\n".join(lines) + "\n")
    if more:
        nxt = events[-1].version
        sys.stdout.write(
            f"… more events follow: `--from {nxt}` shows the next {PAGE}, "
            "`--all` every event, `-n N --last` the newest N\n"
        )
    sys.stdout.flush()


def _history_json(store: Any, session: str, events: list[Any], after: int | None, upto: int | None) -> list[Any]:
    """``history --json``'s list: the events, with the session's recorded ``set_info``
    calls made while the head was one of the versions listed (or, from the beginning,
    before the first event) placed among them by time; so pages never repeat one."""
    from eventstore import interleave_info

    changes = store.info_changes(session)
    if not changes:
        return [e.to_json() for e in events]
    entry = store.info(session)
    head, base = entry.head, entry.baseline
    if events:
        lo, hi = events[0].version - 1, events[-1].version
    else:
        lo = hi = min(base if after is None else max(after, base), head if upto is None else upto)
        if lo > base:
            return []  # an empty window past the start holds no head
    until = None
    if hi < head:
        until = next(iter(store.history(session, after=hi, upto=hi + 1))).recorded_at
    return interleave_info(
        events, changes, start=lo, since=None if lo <= base else events[0].recorded_at, until=until
    )


@cli_errors
def checkout(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar=REF, help="Session, optionally @VERSION."),
    at: int | None = typer.Option(None, "--at", min=0, help="The version (default: head)."),
    as_json: bool = JsonOpt,
) -> None:
    """Show the state of a session at a version (default: its head).

    Version 0 is the empty state. Versions below a compaction baseline are refused.
    With --json, prints the state object: {"messages": [...], "status": ..., "error"?}.
    """
    session, version = resolve_version(ref, at)
    with open_store(ctx) as store:
        state = store.load(session, version=version)
        shown = version if version is not None else store.head(session)
    doc = state.to_json()
    if as_json:
        print_json(doc)
    else:
        from .. import render

        console().print(render.state_panel(doc, f"{session}@{shown}"))
