"""Human output of the CLI: Rich tables, trees and panels. No store access here.

Every function takes plain library results (records, states as JSON dicts, diffs,
turns) and a Rich console; the commands in :mod:`eventstore_cli.app` decide what to
fetch, these decide how it looks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

JSON = dict[str, Any]

STATUS_STYLE = {
    "idle": "green",
    "streaming": "yellow",
    "error": "red",
    "stopped": "magenta",
    "done": "green",
    "running": "yellow",
    "awaiting-confirmation": "cyan",
    "cancelled": "magenta",
}


def iso(dt: datetime | None) -> str | None:
    """ISO 8601 in UTC with a ``Z`` suffix, as the JSON output uses."""
    if dt is None:
        return None
    return dt.isoformat().replace("+00:00", "Z")


def short_time(dt: datetime | None) -> str:
    return "" if dt is None else dt.strftime("%Y-%m-%d %H:%M:%S")


def shorten(text: str, limit: int = 60) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def compact_json(value: Any, limit: int = 60) -> str:
    return shorten(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str), limit)


def styled_status(status: str | None) -> Text:
    s = status or ""
    return Text(s, style=STATUS_STYLE.get(s, ""))


def action_summary(action: Mapping[str, Any]) -> str:
    """A one-line description of an action (the wire shape, docs/format.md)."""
    kind = action.get("type")
    if kind == "send":
        return f"{action.get('id')}: {shorten(str(action.get('text', '')), 50)!r}"
    if kind == "toolPhase":
        prompt = f" {shorten(str(action['prompt']), 40)!r}" if action.get("prompt") else ""
        return f"{action.get('name')} → {action.get('state')}{prompt}"
    if kind == "part":
        part = action.get("part", {})
        pt = part.get("type")
        within = f" [within {action['within']}]" if action.get("within") else ""
        if pt == "text-delta":
            body = f"{part.get('messageId')} {str(part.get('text', ''))!r}"
        elif pt == "reasoning":
            body = f"{part.get('messageId')} {shorten(str(part.get('text', '')), 40)!r}"
        elif pt == "message-start":
            body = str(part.get("messageId"))
        elif pt == "tool-call":
            body = f"{part.get('name')}({part.get('id')}) {compact_json(part.get('input'), 40)}"
        elif pt == "tool-result":
            body = f"{part.get('id')} → {compact_json(part.get('output'), 40)}"
        elif pt == "tool-error":
            body = f"{part.get('id')} ✗ {compact_json(part.get('error'), 40)}"
        elif pt == "finish":
            body = str(part.get("reason", ""))
        elif pt == "error":
            code = f" ({part['code']})" if part.get("code") else ""
            body = f"{part.get('error')}{code}"
        else:
            body = ""
        return f"{pt} {body}".rstrip() + within
    return ""


def history_table(events: Iterable[Any], session: str, title: str | None = None) -> Table:
    """The event log as a table; inherited events show the session that recorded them."""
    t = Table(title=title or f"history of {session}", show_lines=False, header_style="bold")
    t.add_column("ver", justify="right")
    t.add_column("turn", justify="right")
    t.add_column("type")
    t.add_column("action", overflow="fold")
    t.add_column("actor")
    t.add_column("recorded (UTC)")
    t.add_column("by", style="dim")
    for e in events:
        inherited = e.session_id != session
        style = "dim" if inherited else ""
        t.add_row(
            str(e.version),
            str(e.turn),
            Text(e.type, style="bold" if e.type == "send" else ""),
            action_summary(e.action),
            e.actor or "",
            short_time(e.recorded_at),
            e.session_id if inherited else "",
            style=style,
        )
    return t


def _duration(tr: Any) -> str:
    secs = (tr.ended - tr.started).total_seconds()
    return f"{secs:.1f}s" if secs < 120 else f"{secs / 60:.0f}m"


def turns_table(turns: Sequence[Any], session: str) -> Table:
    """The turn view: one row per turn."""
    t = Table(title=f"turns of {session}", show_lines=True, header_style="bold", expand=True)
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("when, who", no_wrap=True)
    t.add_column("user", ratio=2, min_width=12)
    t.add_column("assistant", ratio=3, min_width=14)
    t.add_column("tools", overflow="fold", min_width=16, max_width=32)
    t.add_column("outcome", no_wrap=True)
    for tr in turns:
        tools = Text()
        for i, c in enumerate(tr.tools):
            if i:
                tools.append("\n")
            tools.append("  " * c.depth + c.name + " ")
            tools.append(c.state, style=STATUS_STYLE.get(c.state, ""))
        outcome = styled_status(tr.outcome)
        if tr.error:
            outcome.append(f"\n{shorten(tr.error, 24)}", style="red")
        if tr.retries:
            outcome.append(f"\n{tr.retries} retr{'y' if tr.retries == 1 else 'ies'}", style="yellow")
        when = f"{tr.started.strftime('%H:%M:%S')} +{_duration(tr)}\nv{tr.first_version}–{tr.last_version}"
        if tr.actors:
            when += "\n" + "\n".join(tr.actors)
        t.add_row(
            str(tr.turn) + ("\n(partial)" if tr.partial else ""),
            Text(when, style=""),
            tr.user_text,
            tr.assistant_text,
            tools,
            outcome,
        )
    return t


def turns_view(turns: Sequence[Any], session: str, width: int = 80) -> Any:
    """The turn view: a table on a wide terminal, one block per turn on a narrow one."""
    if width >= 120:
        return turns_table(turns, session)
    out: list[Any] = [Text(f"turns of {session}", style="bold")]
    for tr in turns:
        head = Text()
        head.append(f"turn {tr.turn}", style="bold")
        if tr.partial:
            head.append(" (partial: starts before the baseline)", style="dim")
        head.append(f"  v{tr.first_version}–{tr.last_version}  ", style="dim")
        head.append(f"{short_time(tr.started)} +{_duration(tr)}  ")
        head.append(", ".join(tr.actors), style="cyan")
        head.append("  ")
        head.append_text(styled_status(tr.outcome))
        if tr.retries:
            head.append(f"  {tr.retries} retr{'y' if tr.retries == 1 else 'ies'}", style="yellow")
        out.append(head)
        if tr.user_text:
            out.append(Text.assemble(("  user       ", "bold blue"), tr.user_text))
        if tr.assistant_text:
            out.append(Text.assemble(("  assistant  ", "bold magenta"), tr.assistant_text))
        if tr.tools:
            line = Text("  tools      ", style="bold")
            for i, c in enumerate(tr.tools):
                if i:
                    line.append(" · ")
                line.append(("↳ " if c.depth else "") + c.name + " ")
                line.append(c.state, style=STATUS_STYLE.get(c.state, ""))
            out.append(line)
        if tr.error:
            out.append(Text(f"  error      {tr.error}", style="red"))
        out.append(Text(""))
    return Group(*out)


def sessions_table(infos: Sequence[Any]) -> Table:
    t = Table(title="sessions", header_style="bold")
    t.add_column("session")
    t.add_column("head", justify="right")
    t.add_column("parent")
    t.add_column("fork", justify="right")
    t.add_column("baseline", justify="right")
    t.add_column("state")
    for s in infos:
        t.add_row(
            s.id,
            str(s.head),
            s.parent or "",
            "" if s.fork_version is None else str(s.fork_version),
            str(s.baseline or 0),
            Text(session_state(s)),
        )
    return t


def session_state(info: Any) -> str:
    """closed (with the reason), interrupted, or streaming (a turn holds the session)."""
    if info.closed_at is not None:
        return f"closed: {info.closed_reason}" if info.closed_reason else "closed"
    if info.interrupted:
        return "interrupted"
    if info.writer_seen is not None:
        return "streaming"
    return ""


def branch_tree(infos: Sequence[Any]) -> Tree | None:
    """Parent → children, each child labelled with its fork version; None without branches."""
    if not any(s.parent for s in infos):
        return None
    ids = {s.id for s in infos}
    children: dict[str, list[Any]] = {}
    for s in infos:
        if s.parent:
            children.setdefault(s.parent, []).append(s)
    tree = Tree("[bold]branches[/bold]")

    def add(node: Tree, info: Any) -> None:
        for c in children.get(info.id, []):
            add(node.add(f"{c.id} [dim](forked at {c.fork_version}, head {c.head})[/dim]"), c)

    for s in infos:
        if (not s.parent or s.parent not in ids) and s.id in children:
            add(tree.add(f"[bold]{s.id}[/bold] [dim](head {s.head})[/dim]"), s)
    return tree


def _part_lines(part: Mapping[str, Any], indent: int) -> list[Text]:
    pad = "  " * indent
    kind = part.get("type")
    if kind == "text":
        return [Text(pad + str(part.get("text", "")))]
    if kind == "reasoning":
        return [Text(pad + "💭 " + str(part.get("text", "")), style="dim italic")]
    if kind == "tool":
        state = str(part.get("state"))
        line = Text(pad + "⚙ ")
        line.append(f"{part.get('name')}", style="bold")
        line.append(f"({compact_json(part.get('input', {}), 50)}) ")
        line.append(state, style=STATUS_STYLE.get(state, ""))
        out = [line]
        if "prompt" in part:
            out.append(Text(pad + f"   ? {part['prompt']}", style="cyan"))
        if "output" in part:
            out.append(Text(pad + f"   → {compact_json(part['output'], 70)}", style="green"))
        if "error" in part:
            out.append(Text(pad + f"   ✗ {compact_json(part['error'], 70)}", style="red"))
        agent = part.get("agent")
        if isinstance(agent, Mapping):
            head = Text(pad + "   sub-agent ")
            head.append_text(styled_status(str(agent.get("status"))))
            out.append(head)
            for m in agent.get("messages", []):
                out.extend(_message_lines(m, indent + 2))
        return out
    return [Text(pad + json.dumps(part, default=str), style="dim")]


def _message_lines(m: Mapping[str, Any], indent: int = 0) -> list[Text]:
    pad = "  " * indent
    role = str(m.get("role"))
    head = Text(pad)
    head.append(f"{role} ", style="bold blue" if role == "user" else "bold magenta")
    head.append(f"{m.get('id')}", style="dim")
    out = [head]
    for p in m.get("parts", []):
        out.extend(_part_lines(p, indent + 1))
    return out


def state_panel(state: Mapping[str, Any], title: str) -> Panel:
    """A checked-out state: every message with its parts, then status and error."""
    lines: list[Text] = []
    for m in state.get("messages", []):
        lines.extend(_message_lines(m))
    foot = Text("status: ")
    foot.append_text(styled_status(str(state.get("status"))))
    err = state.get("error")
    if isinstance(err, Mapping):
        code = f" ({err['code']})" if err.get("code") else ""
        foot.append(f"   error: {err.get('message')}{code}", style="red")
    if not lines:
        lines.append(Text("(no messages)", style="dim"))
    return Panel(Group(*lines, Text(""), foot), title=title, title_align="left")


def diff_view(d: Any) -> Group:
    """A coloured diff: base, added (green), removed (red), changed (yellow, with details)."""
    out: list[Any] = []
    head = Text()
    head.append(f"{d.left}", style="bold red")
    head.append("  ⟷  ")
    head.append(f"{d.right}", style="bold green")
    out.append(head)
    if d.base is None:
        out.append(Text("no shared history", style="dim"))
    else:
        out.append(
            Text(
                f"base {d.base}   ({d.events_left} event(s) on the left, "
                f"{d.events_right} on the right since)",
                style="dim",
            )
        )
    if d.identical:
        out.append(Text("no differences", style="bold"))
        return Group(*out)
    for mid in d.removed:
        out.append(Text(f"- {d.summary(mid)}", style="red"))
    for mid in d.added:
        out.append(Text(f"+ {d.summary(mid)}", style="green"))
    for c in d.details:
        out.append(Text(f"~ {c.role} {c.id}", style="yellow"))
        for line in c.lines:
            style = "green" if line.startswith("+") else "red" if line.startswith("-") else ""
            out.append(Text(f"    {line}", style=style))
    if d.status_left != d.status_right:
        st = Text("status ")
        st.append(d.status_left, style="red")
        st.append(" → ")
        st.append(d.status_right, style="green")
        out.append(st)
    if d.error_left != d.error_right:
        out.append(
            Text(
                f"error {_err(d.error_left)} → {_err(d.error_right)}",
                style="yellow",
            )
        )
    return Group(*out)


def diff_events(d: Any) -> Group:
    """The events on each side since the fork point (``diff --events``)."""
    out: list[Any] = []
    for label, ref, events, style in (
        ("left", d.left, d.left_events or (), "red"),
        ("right", d.right, d.right_events or (), "green"),
    ):
        out.append(Text(f"{label} {ref}: {len(events)} event(s) since the base", style=f"bold {style}"))
        for e in events:
            line = Text(f"  {e.version:>5} ", style=style)
            line.append(f"{e.type:<9}", style="cyan")
            line.append(action_summary(e.action))
            out.append(line)
    return Group(*out)


def _err(e: Mapping[str, Any] | None) -> str:
    return "none" if not e else repr(e.get("message"))


def replay_line(step: Any, console: Console) -> None:
    """One replay step: version, event and what it changed."""
    e = step.event
    head = Text(f"{e.version:>5} ", style="bold")
    head.append(f"{e.type:<9}", style="cyan")
    head.append(action_summary(e.action))
    console.print(head)
    for line in step.changes:
        console.print(Text(f"        {line}", style="dim"))
