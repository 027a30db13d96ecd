"""The ``eventstore`` command: a thin Typer layer over the public eventstore API.

Each command opens the store, calls one library function and renders the result
(human output with Rich, or one JSON document with ``--json``). Library errors become
one ``error: …`` line on stderr and exit code 1 (a JSON object with ``--json``, see
:mod:`.errors`); usage errors (conflicting options) exit 2. Rendering lives in
:mod:`.render` and :mod:`.listing`; every stored value is made terminal-safe by
:mod:`.terminal` on its way out.

Start-up matters for a command line: this module imports only Typer and the CLI's own
small modules. The library, Rich and the renderers are imported inside the commands
that need them, so ``eventstore --help`` never loads SQLAlchemy or pydantic.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup

from .database import DEFAULT_URL, open_store, parse_ref, resolve_version, sqlite_file
from .errors import cli_errors, emit_error, fail, json_mode, usage
from .inputs import read_actions
from .terminal import console, is_terminal, json_text, safe

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

__all__ = ["app", "main", "cli_errors", "fail", "usage", "open_store", "parse_ref", "read_actions"]

#: Events ``history`` shows on a terminal unless told otherwise (--all, -n, --from).
PAGE = 100


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

JsonOpt = typer.Option(False, "--json", help="Print one JSON document on stdout instead of tables.")
SESSION = "SESSION"
REF = "SESSION[@V]"


# -- plumbing ---------------------------------------------------------------------------


def _out() -> Console:
    return console()


def print_json(doc: Any) -> None:
    """``doc`` as JSON on stdout: exact values, terminal-safe spelling."""
    typer.echo(json_text(doc))


def _progress() -> Progress:
    """A Rich progress bar on stderr, shown only when stderr is a terminal."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}", markup=False),  # descriptions may name stored ids
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console(stderr=True),
        transient=True,
        disable=not is_terminal(sys.stderr),
    )


@contextmanager
def _working(what: str) -> Iterator[None]:
    """A transient spinner on stderr while a long read runs (only on a terminal)."""
    if not is_terminal(sys.stderr):
        yield
        return
    with _progress() as bar:
        bar.add_task(what, total=None)
        yield


def _width() -> int | None:
    """The terminal's width when stdout is one, else ``None`` (lines are not cut)."""
    if not is_terminal():
        return None
    import shutil

    return shutil.get_terminal_size().columns


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"eventstore {version('eventstore')}")
        raise typer.Exit()


# -- the app ----------------------------------------------------------------------------


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


@app.command()
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


@app.command()
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


@app.command()
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
        from .catalogue import catalogue_table, parse_meta

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
            _out().print(catalogue_table(page.items, page.next_cursor))
        return
    with open_store(ctx) as store:
        infos = list(store.sessions())
    if as_json:
        print_json([s.to_json() for s in infos])
        return
    if not infos:
        typer.echo("no sessions yet — try `eventstore demo` or `eventstore append`")
        return
    from . import render

    out = _out()
    out.print(render.sessions_table(infos))
    tree = render.branch_tree(infos)
    if tree is not None:
        out.print(tree)


@app.command()
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
    from .catalogue import info_table, parse_meta

    metadata = parse_meta(meta)
    with open_store(ctx) as store:
        if title is not None or owner is not None or metadata:
            store.set_info(session, title=title, owner=owner, metadata=metadata or None, actor=actor)
        entry = store.info(session)
        changes = store.info_changes(session)
    if as_json:
        print_json({**entry.to_json(), "info_changes": [c.to_json() for c in changes]})
    else:
        _out().print(info_table(entry, changes))


@app.command()
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
            with _working(f"reading the turns of {safe(session)}"):
                rows = store.turns(session, upto=version)
                kept = store.lines(session)
            if as_json:
                print_json([r.to_json() for r in rows])
            else:
                from . import render

                out = _out()
                out.print(render.turns_view(rows, session, width=out.width))
                if kept:
                    out.print(render.kept_lines(kept))
            return
        want = PAGE + 1 if paged else limit
        with _working(f"reading the history of {safe(session)}"):
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
    from .listing import history_lines

    lines = history_lines(events, session, _width())
    sys.stdout.write("\n".join(lines) + "\n")
    if more:
        nxt = events[-1].version
        sys.stdout.write(
            f"… more events follow: `--from {nxt}` shows the next {PAGE}, "
            "`--all` every event, `-n N --last` the newest N\n"
        )
    sys.stdout.flush()


@app.command()
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
        from . import render

        _out().print(render.state_panel(doc, f"{session}@{shown}"))


@app.command()
@cli_errors
def branch(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar=REF, help="Session to fork, optionally @VERSION."),
    at: int | None = typer.Option(None, "--at", min=0, help="Fork at this version (default: head)."),
    name: str | None = typer.Option(None, "--name", "-n", help="Id of the new session (default: generated)."),
    as_json: bool = JsonOpt,
) -> None:
    """Fork a session at a version into a new session, in constant time.

    The branch shares the parent's events up to the fork point (nothing is copied) and
    continues its numbering: a branch made at 3 has head 3. Writes to either side never
    change the other. A new id must not end in '@' and digits (it would read as
    SESSION@VERSION).
    """
    session, version = resolve_version(ref, at)
    with open_store(ctx) as store:
        new_id = store.branch(session, at=version, new_id=name)
        head = store.head(new_id)
    if as_json:
        print_json({"id": new_id, "parent": session, "fork_version": head})
    else:
        typer.echo(f"created {safe(new_id)} from {safe(session)}@{head}")


@app.command()
@cli_errors
def rewind(
    ctx: typer.Context,
    session: str = typer.Argument(..., help="Session to rewind."),
    to: int = typer.Option(..., "--to", min=0, help="The version that becomes the head (0: empty)."),
    reason: str | None = typer.Option(None, "--reason", help="Why (kept in the audit record)."),
    expected_version: int | None = typer.Option(
        None, "--expected-version", min=0, help="Fail unless the head is this version."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Rewind a session to an earlier version, keeping the line it leaves; print its id.

    Nothing is changed, copied or deleted: the events after the version stay readable
    under the kept id SESSION~N (a line closed to writes; branch it to continue it).
    Prints nothing but a note when the version already is the head.
    """
    with open_store(ctx) as store:
        kept = store.rewind(session, to=to, reason=reason, expected_version=expected_version)
    if as_json:
        print_json({"session": session, "to": to, "kept": kept})
    elif kept is None:
        typer.echo(f"{safe(session)} is already at version {to}; nothing to rewind")
    else:
        typer.echo(safe(kept))


@app.command()
@cli_errors
def diff(
    ctx: typer.Context,
    left: str = typer.Argument(..., metavar=REF, help="Left ref (SESSION or SESSION@VERSION)."),
    right: str = typer.Argument(..., metavar=REF, help="Right ref (SESSION or SESSION@VERSION)."),
    events: bool = typer.Option(
        False, "--events", "-e", help="Also list the events on each side since the fork point."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Compare two refs: the shared fork point, and which messages differ.

    Finds the newest state both share (through any depth of branching), then lists
    messages added (only in the right, green), removed (only in the left, red) and changed (yellow,
    with appended text and tool state changes), the status of each side and the number
    of events on each side since the fork.
    """
    a = parse_ref(left)
    b = parse_ref(right)
    with open_store(ctx) as store, _working("comparing"):
        d = store.diff(a, b, events=events)
    if as_json:
        print_json(d.to_json())
    else:
        from . import render

        out = _out()
        out.print(render.diff_view(d))
        if events:
            out.print(render.diff_events(d))


@app.command()
@cli_errors
def compact(
    ctx: typer.Context,
    session: str | None = typer.Argument(None, metavar=SESSION, help="The session to compact (omit with --all)."),
    upto: int | None = typer.Option(None, "--upto", min=1, help="Fold events 1..V into the baseline."),
    archive: Path | None = typer.Option(
        None, "--archive", "-a", help="First write the session as JSON Lines here (restorable with import)."
    ),
    all_sessions: bool = typer.Option(
        False, "--all", help="Compact every session by policy (needs --keep-last-turns)."
    ),
    keep_last_turns: int | None = typer.Option(
        None, "--keep-last-turns", min=0, help="With --all: keep the last N turns of each session loadable."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Fold the start of a session's log into a baseline state, to bound its size.

    After `compact S --upto V`, loading S below V fails with a message naming the
    baseline; V and later load exactly as before, and every branch made earlier keeps
    working. With --archive the session is first written to FILE, which
    `eventstore import FILE` restores: in place (undoing the compaction) or into
    another database.

    Policy form: `compact --all --keep-last-turns N` keeps the last N turns of every
    session and compacts the rest.
    """
    if all_sessions:
        if session is not None or upto is not None or archive is not None:
            usage("--all takes no SESSION, --upto or --archive")
        if keep_last_turns is None:
            usage("--all needs --keep-last-turns N")
        with open_store(ctx) as store, _progress() as bar:
            task = bar.add_task("compacting", total=None)

            def tick(done: int, total: int, _sid: str) -> None:
                bar.update(task, completed=done, total=total)

            results = store.compact_all(keep_last_turns=keep_last_turns, progress=tick)
        if as_json:
            print_json([r.to_json() for r in results])
        else:
            _compact_summary(results)
        return
    if session is None or upto is None:
        usage("give SESSION --upto V, or --all --keep-last-turns N")
    with open_store(ctx) as store, _working(f"compacting {safe(session)}"):
        r = store.compact(session, upto=upto, archive=archive)
    if as_json:
        print_json(r.to_json())
    else:
        msg = f"{safe(session)}: baseline is now {r.baseline}; {r.removed} event(s) removed"
        if r.kept_for_branches:
            msg += f", {r.kept_for_branches} kept for branches"
        if archive is not None:
            msg += f"; archived {r.archived} event(s) to {safe(archive)}"
        typer.echo(msg)


def _compact_summary(results: list[Any]) -> None:
    """One line per session that lost events, then one line of totals."""
    removed = [r for r in results if r.removed]
    for r in removed:
        kept = f", events up to {r.kept_for_branches} kept for branches" if r.kept_for_branches else ""
        typer.echo(f"{safe(r.session)}: baseline {r.baseline}, {r.removed} event(s) removed{kept}")
    moved = sum(1 for r in results if r.baseline_moved and not r.removed)
    untouched = len(results) - len(removed) - moved
    summary = f"{sum(r.removed for r in results)} event(s) removed from {len(removed)} of {len(results)} session(s)"
    if moved:
        summary += f"; {moved} baseline(s) moved with every event kept for branches"
    if untouched:
        summary += f"; {untouched} session(s) already within the policy"
    typer.echo(summary)


@app.command()
@cli_errors
def replay(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar=REF, help="The session to step through (SESSION@V: up to V)."),
    start: int | None = typer.Option(None, "--from", min=0, help="Start from the state at this version."),
    stop: int | None = typer.Option(None, "--to", min=0, help="Stop after this version (default: head)."),
    as_json: bool = JsonOpt,
) -> None:
    """Step through the fold event by event: each event and what it changed.

    Starts from the state at --from (default: the baseline, 0 when never compacted) and
    applies each event up to --to, printing the message-level change it caused.
    """
    session, version = parse_ref(ref)
    if version is not None:
        if stop is not None and stop != version:
            usage("give the end version once (SESSION@V or --to V)")
        stop = version
    if start is not None and stop is not None and start > stop:
        usage(f"--from {start} is after --to {stop}")
    with open_store(ctx) as store:
        with _working(f"replaying {safe(session)}"):
            steps = list(store.replay(session, after=start, upto=stop))
        if as_json:
            print_json([s.to_json() for s in steps])
            return
    from .listing import replay_lines

    sys.stdout.write("".join(line + "\n" for line in replay_lines(steps, _width())))
    typer.echo(f"{len(steps)} event(s) replayed")


@app.command()
@cli_errors
def verify(
    ctx: typer.Context,
    session: str | None = typer.Argument(None, metavar=SESSION, help="The session to check (default: all)."),
    checkpoint: Path | None = typer.Option(
        None, "--checkpoint", help="Also prove the database still extends this signed checkpoint."
    ),
    public_key: Path | None = typer.Option(
        None, "--public-key", help="The public key the checkpoint must be signed with."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Check integrity: the hash chain of every event, turns, baselines and that snapshots
    equal the fold; with --checkpoint, also that nothing it anchors was rewritten.

    Exits with code 1 when any problem is found. Erasures and rewinds are listed, not
    failures; so are the recorded `info` changes (who set a title, owner or metadata).
    """
    from .keys import read_checkpoint, read_key

    if (checkpoint is None) != (public_key is None):
        usage("--checkpoint and --public-key go together")
    cp = read_checkpoint(checkpoint) if checkpoint is not None else None
    key = read_key(public_key, private=False) if public_key is not None else None
    with open_store(ctx) as store, _progress() as bar:
        task = bar.add_task("verifying", total=None)

        def tick(done: int, total: int, _sid: str) -> None:
            bar.update(task, completed=done, total=total)

        report = store.verify(session, checkpoint=cp, public_key=key, progress=tick)
    if as_json:
        print_json(report.to_json())
    else:
        _verify_lines(report)
    if not report.ok:
        fail(f"verify found {len(report.problems)} problem(s); see above", kind="VerifyFailed")


@app.command()
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


def _verify_lines(report: Any) -> None:
    """``verify``'s human output: a line per session, its problems, erasures, rewinds and
    info changes, a verdict."""
    import json

    from rich.text import Text

    out = _out()
    for sid in report.sessions:
        mine = report.for_session(sid)
        mark = Text("FAILED", style="red") if mine else Text("ok", style="green")
        out.print(Text(f"{safe(sid)}: ").append_text(mark))
        for p in mine:
            out.print(Text("  • ", style="red").append(safe(p.message)))
    checked = set(report.sessions)
    for p in report.problems:
        if p.session not in checked:  # a vanished session, a bad signature
            out.print(Text("• ", style="red").append(safe(p.message)))
    for n in report.notices:
        out.print(Text(f"{safe(n.kind)}: ", style="yellow").append(safe(n.message)))
    if len(report.sessions) == 1:
        for c in report.info_changes:
            by = f" by {c.actor!r}" if c.actor else ""
            what = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in c.changes.items())
            out.print(Text("info: ", style="yellow").append(
                safe(f"set{by} at {c.changed_at.isoformat()}: {what}")
            ))
    elif report.info_changes:
        out.print(Text("info: ", style="yellow").append(
            f"{len(report.info_changes)} recorded set_info change(s) (--json lists them)"
        ))
    if report.checkpoint is not None:
        out.print(Text(f"checkpoint of {safe(report.checkpoint)}: ").append_text(
            Text("extended", style="green") if report.ok else Text("NOT extended", style="red")
        ))
    if not report.sessions and not report.problems:
        typer.echo("no sessions to verify")
    else:
        verdict = Text("ok", style="green") if report.ok else Text("problems found", style="red")
        out.print(verdict.append(f": {report.events} event(s) and {report.snapshots} snapshot(s) checked"))


@app.command()
@cli_errors
def keygen(
    out: Path = typer.Option(..., "--out", help="Write the private key here (mode 0600) and the public key to OUT.pub."),
) -> None:
    """Make an Ed25519 key pair for signing checkpoints. Keep the private key off the
    database host; give the public key to whoever verifies."""
    from .keys import write_keypair

    private, public = write_keypair(out)
    typer.echo(f"wrote {safe(private)} (private, 0600) and {safe(public)} (public)")


@app.command("checkpoint")
@cli_errors
def checkpoint_cmd(
    ctx: typer.Context,
    key: Path = typer.Option(..., "--key", help="The private key file (from `eventstore keygen`)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),
) -> None:
    """Sign a checkpoint of every session's head, hash and baseline (one line of JSON).
    Store it where the database's owners cannot rewrite it; verify against it later."""
    from .keys import read_key, write_checkpoint

    pem = read_key(key, private=True)
    with open_store(ctx) as store:
        cp = store.checkpoint(pem)
    if output is None:
        sys.stdout.write(cp.to_json() + "\n")
        return
    write_checkpoint(output, cp)
    typer.echo(f"checkpoint of {len(cp.sessions)} session(s) written to {safe(output)}", err=True)


@app.command()
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


@app.command("export")
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
    with open_store(ctx) as store, _progress() as bar:
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


@app.command("import")
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
    with open_store(ctx) as store, _progress() as bar:
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


@app.command()
@cli_errors
def demo(ctx: typer.Context) -> None:
    """Record a sample conversation, branch it, and show history, checkout and diff.

    Runs on the database named by --db (default: the SQLite file ./eventstore.db, created
    when missing, so no setup is needed): migrates it, records a shopping-assistant chat (tool calls, a confirmation, a nested sub-agent, a network
    error and a retry) as session `demo` (`demo-2`, … when taken), forks it after the
    first turn into `<id>-alt` with a different second turn, then prints the turn view,
    the branch's state and the diff between the two paths.
    """
    from .demo import run_demo

    with open_store(ctx, create=True) as store:
        run_demo(store, _out())


@app.command()
@cli_errors
def report(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="SESSION[@V]", help="Session, optionally @VERSION."),
    at: int | None = typer.Option(None, "--at", min=0, help="Render the session as it was at this version."),
    output: Path | None = typer.Option(None, "--output", "-o", metavar="FILE", help="Write the page here instead of stdout."),
    against: str | None = typer.Option(
        None, "--diff", metavar="B[@V]", help="Render the difference from SESSION[@V] to this ref instead."
    ),
    checkpoint: Path | None = typer.Option(
        None, "--checkpoint", metavar="FILE", help="Also show whether the database still extends this signed checkpoint."
    ),
    public_key: Path | None = typer.Option(
        None, "--public-key", metavar="FILE", help="The public key the checkpoint must be signed with."
    ),
) -> None:
    """Write the audit report: one self-contained HTML page to open in any browser.

    Shows the session's header (head, creation, actors, the verify result, the branch
    tree with fork points) and every turn: who and when, the user text, the assistant
    text, each tool call with its input, output or error, final state and time taken,
    sub-agent runs, stops, retries, errors and interrupted turns, with the versions to
    give `eventstore checkout`. Nothing in the page loads from the network or runs code
    from the log. With --diff, the page shows what differs between two refs instead.
    """
    from .keys import read_checkpoint, read_key

    session, version = resolve_version(ref, at)
    other = parse_ref(against) if against is not None else None
    if (checkpoint is None) != (public_key is None):
        usage("--checkpoint and --public-key go together")
    if checkpoint is not None and other is not None:
        usage("--checkpoint goes with a session's report, not with --diff")
    cp = read_checkpoint(checkpoint) if checkpoint is not None else None
    key = read_key(public_key, private=False) if public_key is not None else None
    with open_store(ctx) as store:
        page = store.report(session, version, against=other, out=output, checkpoint=cp, public_key=key)
    if output is None:
        sys.stdout.write(page)
        sys.stdout.flush()
        return
    what = ref if against is None else f"{ref} against {against}"
    typer.echo(f"wrote the report of {safe(what)} to {safe(output)}", err=True)


@app.command()
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


def _event_line(e: Any, with_position: bool) -> str:
    """One event as one human line: [position] when, session@version, type, actor, summary
    (stored text made terminal-safe)."""
    from .summary import action_summary, short_time

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


@app.command()
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


@app.command("feed")
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
