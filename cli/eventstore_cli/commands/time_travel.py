"""Commands over versions and branches: branch, rewind, diff, replay and compact."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from ..database import open_store, parse_ref, resolve_version
from ..errors import cli_errors, usage
from ..options import REF, SESSION, JsonOpt
from ..output import print_json, progress_bar, terminal_width, working
from ..terminal import console, safe

__all__ = ["branch", "rewind", "diff", "compact", "replay"]


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
    with open_store(ctx) as store, working("comparing"):
        d = store.diff(a, b, events=events)
    if as_json:
        print_json(d.to_json())
    else:
        from .. import render

        out = console()
        out.print(render.diff_view(d))
        if events:
            out.print(render.diff_events(d))


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
        with open_store(ctx) as store, progress_bar() as bar:
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
    with open_store(ctx) as store, working(f"compacting {safe(session)}"):
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
        with working(f"replaying {safe(session)}"):
            steps = list(store.replay(session, after=start, upto=stop))
        if as_json:
            print_json([s.to_json() for s in steps])
            return
    from ..listing import replay_lines

    sys.stdout.write("".join(line + "\n" for line in replay_lines(steps, terminal_width())))
    typer.echo(f"{len(steps)} event(s) replayed")
