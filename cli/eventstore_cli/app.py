"""The ``eventstore`` command: a thin Typer layer over the public eventstore API.

Each command opens the store, calls one library function and renders the result
(human output with Rich, or one JSON document with ``--json``). Library errors become
one ``error: …`` line on stderr and exit code 1; usage errors (a malformed
``SESSION@VERSION``, conflicting options) exit 2. Rendering lives in :mod:`.render`.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from eventstore import EventStore, EventStoreError

from . import render

DEFAULT_URL = "sqlite:///eventstore.db"

app = typer.Typer(
    name="eventstore",
    help=(
        "Event-sourced AI chat sessions on SQLite or PostgreSQL, with time travel.\n\n"
        "Every action of a chat (a user message, a streamed part, a tool phase, a stop, a retry) "
        "is one immutable event. Load any version, fork a session at any turn, compare two "
        "paths, fold old history into a baseline, and audit what happened.\n\n"
        "Refs are SESSION or SESSION@VERSION (version 0 is the empty state). "
        "Try `eventstore demo` first."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

F = TypeVar("F", bound=Callable[..., Any])

JsonOpt = typer.Option(False, "--json", help="Print one JSON document on stdout instead of tables.")


# -- plumbing ---------------------------------------------------------------------------


def _out() -> Console:
    # Created per call: the test runner swaps sys.stdout between invocations.
    return Console(soft_wrap=False)


def _err_console() -> Console:
    return Console(stderr=True)


# The --db URL of the running command, so that `fail` can mask its password in any message.
_current_url = ""


def _passwords(url: str) -> list[str]:
    found = re.findall(r"://[^:/@]*:([^@/]*)@", url) + re.findall(r"(?i)password=([^&]*)", url)
    return [p for p in found if p]


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` on stderr (one line, passwords masked) and exit."""
    for pw in _passwords(_current_url):
        message = message.replace(pw, "***")
    message = " ".join(str(message).split())
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def usage(message: str) -> NoReturn:
    """A usage error: exit code 2, like Typer's own."""
    raise typer.BadParameter(message)


def cli_errors(fn: F) -> F:
    """Turn every expected failure of a command into one line on stderr and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except EventStoreError as exc:
            fail(str(exc))
        except FileNotFoundError as exc:
            fail(f"no such file: {exc.filename}")
        except IsADirectoryError as exc:
            fail(f"is a directory: {exc.filename}")
        except PermissionError as exc:
            fail(f"permission denied: {exc.filename}")
        except OSError as exc:
            fail(f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""))
        except UnicodeDecodeError as exc:
            fail(f"input is not UTF-8 text: {exc.reason}")
        except RecursionError:  # json.loads of a hostile, deeply nested file
            fail("input is nested too deeply to be an action")
        except KeyboardInterrupt:
            fail("interrupted", 130)

    return wrapper  # type: ignore[return-value]


@contextmanager
def open_store(ctx: typer.Context) -> Iterator[EventStore]:
    url = ctx.obj["db"] if ctx.obj else DEFAULT_URL
    with EventStore(url) as store:
        yield store


def parse_ref(text: str, *, allow_head: bool = True) -> tuple[str, int | None]:
    """``SESSION`` → (SESSION, None); ``SESSION@VERSION`` → (SESSION, VERSION).

    The last ``@`` separates the version, so session ids may contain ``@`` themselves
    as long as a version follows (``user@example.com@3``).
    """
    if "@" not in text:
        if not text:
            usage("empty session id")
        return text, None
    session, _, version = text.rpartition("@")
    if not session:
        usage(f"bad ref {text!r}: expected SESSION or SESSION@VERSION")
    if version == "head" and allow_head:
        return session, None
    if not (version.isascii() and version.isdigit()):
        usage(f"bad ref {text!r}: the version after '@' must be a number ≥ 0 (or 'head')")
    return session, int(version)


def _resolve_version(ref: str, at: int | None) -> tuple[str, int | None]:
    session, version = parse_ref(ref)
    if at is not None:
        if version is not None and version != at:
            usage(f"{ref!r} and --at {at} name different versions; give one")
        version = at
    return session, version


def print_json(doc: Any) -> None:
    typer.echo(json.dumps(doc, ensure_ascii=False, default=str, indent=2))


def _progress() -> Progress:
    """A Rich progress bar on stderr, shown only when stderr is a terminal."""
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_err_console(),
        transient=True,
        disable=not sys.stderr.isatty(),
    )


def read_actions(path: str) -> list[dict[str, Any]]:
    """Actions from a JSON array, a single JSON object, or JSON Lines (``-`` = stdin)."""
    if path == "-":
        text = sys.stdin.read()
        name = "<stdin>"
    else:
        text = Path(path).read_text(encoding="utf-8")
        name = path
    stripped = text.strip()
    if not stripped:
        fail(f"{name}: no actions (empty input)")
    if stripped[0] in "[{":
        try:
            doc = json.loads(stripped)
        except json.JSONDecodeError as exc:
            if stripped[0] == "[":
                fail(f"{name}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")
            doc = None  # maybe JSON Lines of objects
        if isinstance(doc, list):
            if not all(isinstance(a, dict) for a in doc):
                fail(f"{name}: every element of the array must be a JSON object (an action)")
            return doc
        if isinstance(doc, dict):
            return [doc]
    actions: list[dict[str, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            fail(f"{name}: line {n} is not valid JSON ({exc.msg}); expected a JSON array or JSON Lines")
        if not isinstance(obj, dict):
            fail(f"{name}: line {n} is not a JSON object (an action)")
        actions.append(obj)
    return actions


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
) -> None:
    """Event-sourced AI chat sessions with time travel."""
    global _current_url
    ctx.obj = {"db": db}
    _current_url = db


@app.command()
@cli_errors
def migrate(ctx: typer.Context) -> None:
    """Create the schema, or upgrade it to the newest revision.

    Safe to run any number of times; every other command needs a migrated database.
    """
    with open_store(ctx) as store:
        store.migrate()
        where = store.url  # the library's one masking of a URL's password
    typer.echo(f"schema is up to date ({where})")


@app.command()
@cli_errors
def append(
    ctx: typer.Context,
    session: str = typer.Argument(..., help="The session to append to (created when new)."),
    file: str = typer.Argument("-", help="A JSON array of actions or JSON Lines; '-' = stdin."),
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

    Example: echo '{"type":"send","id":"u-1","text":"hi"}' | eventstore append s1 -
    """
    if "@" in session:
        usage("append takes a SESSION, not a ref with @VERSION (events go at the head)")
    actions = read_actions(file)
    with open_store(ctx) as store:
        r = store.append(session, actions, expected_version=expected_version, actor=actor)
    if as_json:
        print_json(r.to_json())
    else:
        typer.echo(f"appended {len(actions)} event(s) to {session}: head is now {r.version}")


@app.command()
@cli_errors
def sessions(ctx: typer.Context, as_json: bool = JsonOpt) -> None:
    """List sessions with head, parent, fork point and baseline, and the branch tree."""
    with open_store(ctx) as store:
        infos = list(store.sessions())
    if as_json:
        print_json([s.to_json() for s in infos])
        return
    out = _out()
    if not infos:
        out.print("no sessions yet — try `eventstore demo` or `eventstore append`")
        return
    out.print(render.sessions_table(infos))
    tree = render.branch_tree(infos)
    if tree is not None:
        out.print(tree)


@app.command()
@cli_errors
def history(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="SESSION[@V]", help="Session (optionally up to version V)."),
    turns: bool = typer.Option(
        False, "--turns", "-t", help="One row per turn: who, when, user text, tools, outcome."
    ),
    after: int | None = typer.Option(None, "--from", min=0, help="Only events after this version."),
    limit: int | None = typer.Option(None, "--limit", "-n", min=0, help="At most this many events."),
    last: bool = typer.Option(False, "--last", help="With --limit: the newest events instead of the oldest."),
    as_json: bool = JsonOpt,
) -> None:
    """Show the event log of a session, oldest first.

    A branch's history includes the prefix it inherited; the BY column names the session
    that recorded an inherited event. After a compaction the log starts at the baseline.
    --from, --limit and --last page through a long log (`history s1 -n 20 --last`: the
    newest 20 events). With --turns, one row per turn instead: actor, start and end time,
    the user's text, the assistant's reply (shortened), the tool calls with their final
    states, the outcome (idle / error / stopped) and retries.
    """
    session, version = parse_ref(ref)
    if turns and (after is not None or limit is not None or last):
        usage("--turns shows every turn; it takes no --from, --limit or --last")
    if last and limit is None:
        usage("--last needs --limit N")
    with open_store(ctx) as store:
        if turns:
            rows = store.turns(session, upto=version)
            if as_json:
                print_json([r.to_json() for r in rows])
            else:
                out = _out()
                out.print(render.turns_view(rows, session, width=out.width))
            return
        events = list(store.history(session, after=after, upto=version, limit=limit, desc=last))
    if last:
        events.reverse()  # shown oldest first either way
    if as_json:
        print_json([e.to_json() for e in events])
    else:
        _out().print(render.history_table(events, session))


@app.command()
@cli_errors
def checkout(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="SESSION[@V]", help="Session, optionally @VERSION."),
    at: int | None = typer.Option(None, "--at", min=0, help="The version (default: head)."),
    as_json: bool = JsonOpt,
) -> None:
    """Show the state of a session at a version (default: its head).

    Version 0 is the empty state. Versions below a compaction baseline are refused.
    With --json, prints the state object: {"messages": [...], "status": ..., "error"?}.
    """
    session, version = _resolve_version(ref, at)
    with open_store(ctx) as store:
        state = store.load(session, version=version)
        shown = version if version is not None else store.head(session)
    doc = state.to_json()
    if as_json:
        print_json(doc)
    else:
        _out().print(render.state_panel(doc, f"{session}@{shown}"))


@app.command()
@cli_errors
def branch(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="SESSION[@V]", help="Session to fork, optionally @VERSION."),
    at: int | None = typer.Option(None, "--at", min=0, help="Fork at this version (default: head)."),
    name: str | None = typer.Option(None, "--name", "-n", help="Id of the new session (default: generated)."),
    as_json: bool = JsonOpt,
) -> None:
    """Fork a session at a version into a new session, in constant time.

    The branch shares the parent's events up to the fork point (nothing is copied) and
    continues its numbering: a branch made at 3 has head 3. Writes to either side never
    change the other.
    """
    session, version = _resolve_version(ref, at)
    with open_store(ctx) as store:
        new_id = store.branch(session, at=version, new_id=name)
        head = store.head(new_id)
    if as_json:
        print_json({"id": new_id, "parent": session, "fork_version": head})
    else:
        typer.echo(f"created {new_id} from {session}@{head}")


@app.command()
@cli_errors
def diff(
    ctx: typer.Context,
    left: str = typer.Argument(..., metavar="A[@V]", help="Left ref (SESSION or SESSION@VERSION)."),
    right: str = typer.Argument(..., metavar="B[@V]", help="Right ref."),
    events: bool = typer.Option(
        False, "--events", "-e", help="Also list the events on each side since the fork point."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Compare two refs: the shared fork point, and which messages differ.

    Finds the newest state both share (through any depth of branching), then lists
    messages added (only in B, green), removed (only in A, red) and changed (yellow,
    with appended text and tool state changes), the status of each side and the number
    of events on each side since the fork.
    """
    a = parse_ref(left)
    b = parse_ref(right)
    with open_store(ctx) as store:
        d = store.diff(a, b, events=events)
    if as_json:
        print_json(d.to_json())
    else:
        out = _out()
        out.print(render.diff_view(d))
        if events:
            out.print(render.diff_events(d))


@app.command()
@cli_errors
def compact(
    ctx: typer.Context,
    session: str | None = typer.Argument(None, help="The session to compact (omit with --all)."),
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
            changed = [r for r in results if r.removed or r.baseline_moved]
            for r in changed:
                kept = (
                    f" (events up to {r.kept_for_branches} kept for branches)"
                    if r.kept_for_branches
                    else ""
                )
                typer.echo(f"{r.session}: baseline {r.baseline}, {r.removed} event(s) removed{kept}")
            typer.echo(f"compacted {len(changed)} of {len(results)} session(s)")
        return
    if session is None or upto is None:
        usage("give SESSION --upto V, or --all --keep-last-turns N")
    if "@" in session:
        usage("compact takes a SESSION; give the version with --upto")
    with open_store(ctx) as store:
        r = store.compact(session, upto=upto, archive=archive)
    if as_json:
        print_json(r.to_json())
    else:
        msg = f"{session}: baseline is now {r.baseline}; {r.removed} event(s) removed"
        if r.kept_for_branches:
            msg += f", {r.kept_for_branches} kept for branches"
        if archive is not None:
            msg += f"; archived {r.archived} event(s) to {archive}"
        typer.echo(msg)


@app.command()
@cli_errors
def replay(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="SESSION", help="The session to step through."),
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
        steps = store.replay(session, after=start, upto=stop)
        if as_json:
            print_json([s.to_json() for s in steps])
            return
        out = _out()
        n = 0
        for step in steps:
            render.replay_line(step, out)
            n += 1
        out.print(f"[dim]{n} event(s) replayed[/dim]")


@app.command()
@cli_errors
def verify(
    ctx: typer.Context,
    session: str | None = typer.Argument(None, help="The session to check (default: all)."),
    as_json: bool = JsonOpt,
) -> None:
    """Check integrity: the hash chain of every event and that snapshots equal the fold.

    Exits with code 1 when any problem is found.
    """
    with open_store(ctx) as store, _progress() as bar:
        task = bar.add_task("verifying", total=None)

        def tick(done: int, total: int, _sid: str) -> None:
            bar.update(task, completed=done, total=total)

        report = store.verify(session, progress=tick)
    if as_json:
        print_json(report.to_json())
    else:
        out = _out()
        for sid in report.sessions:
            mine = report.for_session(sid)
            mark = "[red]FAILED[/red]" if mine else "[green]ok[/green]"
            out.print(f"{sid}: {mark}")
            for p in mine:
                out.print(f"  [red]•[/red] {p.message}")
        if not report.sessions:
            typer.echo("no sessions to verify")
        else:
            out.print(
                f"{'[green]ok[/green]' if report.ok else '[red]problems found[/red]'}: "
                f"{report.events} event(s) and {report.snapshots} snapshot(s) checked"
            )
    if not report.ok:
        fail(f"verify found {len(report.problems)} problem(s); see above")


@app.command()
@cli_errors
def recover(
    ctx: typer.Context,
    session: str = typer.Argument(..., help="The session whose streaming turn may have died."),
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
    if as_json:
        print_json(None if r is None else r.to_json())
    elif r is None:
        typer.echo(f"nothing to recover in {session}: it is not streaming, or its writer is alive")
    else:
        typer.echo(
            f"recovered {session}: interrupted at version {r.version}; "
            f"{len(r.messages)} message(s) to continue from"
        )


@app.command("export")
@cli_errors
def export_cmd(
    ctx: typer.Context,
    session: str = typer.Argument(..., help="The session to export."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),
) -> None:
    """Write a session as JSON Lines: lossless (ids, versions, timestamps, actors,
    metadata, hashes, branch links, baseline).

    A branch's file also carries the sessions it descends from, so `eventstore import`
    recreates it anywhere — on SQLite or PostgreSQL — with identical history and hashes.
    """
    if "@" in session:
        usage("export takes a SESSION, not a ref")
    with open_store(ctx) as store, _progress() as bar:
        task = bar.add_task(f"exporting {session}", total=None)

        def tick(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        if output is None:
            buf = io.StringIO()
            n = store.export(session, buf, progress=tick)
            sys.stdout.write(buf.getvalue())
            sys.stdout.flush()
        else:  # the library writes PATH.part and renames it when complete
            n = store.export(session, output, progress=tick)
    if output is not None:
        typer.echo(f"exported {n} event(s) of {session} to {output}", err=True)


@app.command("import")
@cli_errors
def import_cmd(
    ctx: typer.Context,
    file: str = typer.Argument(..., help="A file written by `eventstore export` (or an archive); '-' = stdin."),
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
            typer.echo(f"{r.session}: {r.status} ({r.events} event(s), head {r.head})")


@app.command()
@cli_errors
def demo(ctx: typer.Context) -> None:
    """Record a sample conversation, branch it, and show history, checkout and diff.

    Runs on the default SQLite file (./eventstore.db) with no setup: migrates, records a
    shopping-assistant chat (tool calls, a confirmation, a nested sub-agent, a network
    error and a retry) as session `demo` (`demo-2`, … when taken), forks it after the
    first turn into `<id>-alt` with a different second turn, then prints the turn view,
    the branch's state and the diff between the two paths.
    """
    from .demo import run_demo

    with open_store(ctx) as store:
        run_demo(store, _out())


@app.command()
@cli_errors
def report(
    ctx: typer.Context,
    ref: str = typer.Argument(..., metavar="SESSION[@V]", help="Session, optionally @VERSION."),
    at: int | None = typer.Option(None, "--at", min=0, help="Render the session as it was at this version."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the page here instead of stdout."),
    against: str | None = typer.Option(
        None, "--diff", metavar="B[@V]", help="Render the difference from SESSION[@V] to this ref instead."
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
    session, version = _resolve_version(ref, at)
    other = parse_ref(against) if against is not None else None
    with open_store(ctx) as store:
        page = store.report(session, version, against=other)
    if output is None:
        sys.stdout.write(page)
        sys.stdout.flush()
        return
    # Written beside the target and renamed over it: a reader never sees half a page.
    tmp = output.with_name(f".{output.name}.{os.getpid()}.part")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write(page)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(output)
    finally:
        tmp.unlink(missing_ok=True)
    typer.echo(f"wrote the report of {ref if other is None else f'{ref} against {against}'} to {output}", err=True)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
