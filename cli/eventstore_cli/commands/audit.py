"""Commands that prove what was recorded: verify, keygen, checkpoint and report."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from ..database import open_store, parse_ref, resolve_version
from ..errors import cli_errors, fail, usage
from ..options import SESSION, JsonOpt
from ..output import print_json, progress_bar
from ..terminal import console, safe

__all__ = ["verify", "keygen", "checkpoint_cmd", "report"]


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
    from ..keys import read_checkpoint, read_key

    if (checkpoint is None) != (public_key is None):
        usage("--checkpoint and --public-key go together")
    cp = read_checkpoint(checkpoint) if checkpoint is not None else None
    key = read_key(public_key, private=False) if public_key is not None else None
    with open_store(ctx) as store, progress_bar() as bar:
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


def _verify_lines(report: Any) -> None:
    """``verify``'s human output: a line per session, its problems, erasures, rewinds and
    info changes, a verdict."""
    import json

    from rich.text import Text

    out = console()
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


@cli_errors
def keygen(
    out: Path = typer.Option(..., "--out", help="Write the private key here (mode 0600) and the public key to OUT.pub."),
) -> None:
    """Make an Ed25519 key pair for signing checkpoints. Keep the private key off the
    database host; give the public key to whoever verifies."""
    from ..keys import write_keypair

    private, public = write_keypair(out)
    typer.echo(f"wrote {safe(private)} (private, 0600) and {safe(public)} (public)")


@cli_errors
def checkpoint_cmd(
    ctx: typer.Context,
    key: Path = typer.Option(..., "--key", help="The private key file (from `eventstore keygen`)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),
) -> None:
    """Sign a checkpoint of every session's head, hash and baseline (one line of JSON).
    Store it where the database's owners cannot rewrite it; verify against it later."""
    from ..keys import read_key, write_checkpoint

    pem = read_key(key, private=True)
    with open_store(ctx) as store:
        cp = store.checkpoint(pem)
    if output is None:
        sys.stdout.write(cp.to_json() + "\n")
        return
    write_checkpoint(output, cp)
    typer.echo(f"checkpoint of {len(cp.sessions)} session(s) written to {safe(output)}", err=True)


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
    from ..keys import read_checkpoint, read_key

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
