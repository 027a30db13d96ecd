"""Human output of the CLI: Rich tables, trees and panels. No store access here.

Every function takes plain library results (records, states as JSON dicts, diffs,
turns) and a Rich console; the commands in :mod:`eventstore_cli.app` decide what to
fetch, these decide how it looks. Stored values only ever reach Rich as
:class:`~rich.text.Text` or as strings passed through :func:`.terminal.safe`, on consoles
that parse no markup, so chat text prints literally and cannot drive the terminal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from .summary import action_summary, compact_json, short_time, shorten
from .terminal import safe

__all__ = [
    "short_time",
    "shorten",
    "compact_json",
    "action_summary",
    "styled_status",
    "turns_table",
    "kept_lines",
    "turns_view",
    "sessions_table",
    "branch_tree",
    "state_panel",
    "diff_view",
    "diff_events",
]

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


def styled_status(status: str | None) -> Text:
    s = status or ""
    return Text(safe(s), style=STATUS_STYLE.get(s, ""))


#: Characters of a turn's texts the turn view shows (``--json`` has them whole).
TURN_TEXT = 400


def _body(text: str, limit: int = TURN_TEXT) -> str:
    """A message text for the turn view: its lines kept, cut at ``limit`` characters."""
    text = text.strip()
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return safe(text, multiline=True)


def _duration(tr: Any) -> str:
    secs = (tr.ended - tr.started).total_seconds()
    return f"{secs:.1f}s" if secs < 120 else f"{secs / 60:.0f}m"


def turns_table(turns: Sequence[Any], session: str) -> Table:
    """The turn view: one row per turn."""
    t = Table(title=Text(f"turns of {safe(session)}"), show_lines=True, header_style="bold", expand=True)
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
            tools.append("  " * c.depth + safe(c.name) + " ")
            tools.append(safe(c.state), style=STATUS_STYLE.get(c.state, ""))
        outcome = styled_status(tr.outcome)
        if tr.error:
            outcome.append(f"\n{shorten(tr.error, 24)}", style="red")
        if tr.retries:
            outcome.append(f"\n{tr.retries} retr{'y' if tr.retries == 1 else 'ies'}", style="yellow")
        when = f"{tr.started.strftime('%H:%M:%S')} +{_duration(tr)}\nv{tr.first_version}–{tr.last_version}"
        if tr.actors:
            when += "\n" + "\n".join(safe(a) for a in tr.actors)
        t.add_row(
            str(tr.turn) + ("\n(partial)" if tr.partial else ""),
            Text(when, style=""),
            Text(_body(tr.user_text)),
            Text(_body(tr.assistant_text)),
            tools,
            outcome,
        )
    return t


def _labelled(rows: list[tuple[str, str, Text]]) -> Table:
    """Label / value rows whose values wrap inside their own column, not to column 0."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for label, style, value in rows:
        grid.add_row(Text(label, style=style), value)
    return grid


def kept_lines(lines: Sequence[Any]) -> Any:
    """The lines rewound away from a session, one per line: id, the version it was rewound
    to, its head."""
    out = Text("kept lines (rewound away from this session):", style="dim")
    for line in lines:
        out.append(f"\n  {safe(line.id)}  rewound to v{line.fork_version}, head v{line.head}")
    return out


def turns_view(turns: Sequence[Any], session: str, width: int = 80) -> Any:
    """The turn view: a table on a wide terminal, one block per turn on a narrow one."""
    if width >= 120:
        return turns_table(turns, session)
    out: list[Any] = [Text(f"turns of {safe(session)}", style="bold")]
    for tr in turns:
        head = Text()
        head.append(f"turn {tr.turn}", style="bold")
        if tr.partial:
            head.append(" (partial: starts before the baseline)", style="dim")
        head.append(f"  v{tr.first_version}–{tr.last_version}  ", style="dim")
        head.append(f"{short_time(tr.started)} +{_duration(tr)}  ")
        head.append(", ".join(safe(a) for a in tr.actors), style="cyan")
        head.append("  ")
        head.append_text(styled_status(tr.outcome))
        if tr.retries:
            head.append(f"  {tr.retries} retr{'y' if tr.retries == 1 else 'ies'}", style="yellow")
        out.append(head)
        rows: list[tuple[str, str, Text]] = []
        if tr.user_text:
            rows.append(("user", "bold blue", Text(_body(tr.user_text))))
        if tr.assistant_text:
            rows.append(("assistant", "bold magenta", Text(_body(tr.assistant_text))))
        if tr.tools:
            line = Text()
            for i, c in enumerate(tr.tools):
                if i:
                    line.append(" · ")
                line.append(("↳ " if c.depth else "") + safe(c.name) + " ")
                line.append(safe(c.state), style=STATUS_STYLE.get(c.state, ""))
            rows.append(("tools", "bold", line))
        if tr.error:
            rows.append(("error", "red", Text(safe(tr.error, multiline=True), style="red")))
        if rows:
            out.append(Padding(_labelled(rows), (0, 0, 0, 2)))
        out.append(Text(""))
    return Group(*out)


def sessions_table(infos: Sequence[Any]) -> Table:
    t = Table(title=Text("sessions"), header_style="bold")
    t.add_column("session")
    t.add_column("head", justify="right")
    t.add_column("parent")
    t.add_column("fork", justify="right")
    t.add_column("baseline", justify="right")
    t.add_column("state")
    for s in infos:
        t.add_row(
            Text(safe(s.id)),
            str(s.head),
            Text(safe(s.parent or "")),
            "" if s.fork_version is None else str(s.fork_version),
            str(s.baseline or 0),
            Text(safe(session_state(s))),
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
    tree = Tree(Text("branches", style="bold"))

    def add(node: Tree, info: Any) -> None:
        for c in children.get(info.id, []):
            label = Text(safe(c.id))
            label.append(f" (forked at {c.fork_version}, head {c.head})", style="dim")
            add(node.add(label), c)

    for s in infos:
        if (not s.parent or s.parent not in ids) and s.id in children:
            label = Text(safe(s.id), style="bold")
            label.append(f" (head {s.head})", style="dim")
            add(tree.add(label), s)
    return tree


def _part_lines(part: Mapping[str, Any], indent: int) -> list[Any]:
    pad = "  " * indent
    kind = part.get("type")
    if kind == "text":
        return [_indented(safe(part.get("text", ""), multiline=True), pad)]
    if kind == "reasoning":
        return [_indented("💭 " + safe(part.get("text", ""), multiline=True), pad, "dim italic")]
    if kind == "tool":
        state = str(part.get("state"))
        line = Text(pad + "⚙ ")
        line.append(safe(part.get("name")), style="bold")
        line.append(f"({compact_json(part.get('input', {}), 50)}) ")
        line.append(safe(state), style=STATUS_STYLE.get(state, ""))
        out: list[Any] = [line]
        if "prompt" in part:
            out.append(_indented("? " + safe(part["prompt"], multiline=True), pad + "   ", "cyan"))
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
    return [Text(pad + compact_json(part, 10_000), style="dim")]


def _indented(text: str, pad: str, style: str = "") -> Any:
    """``text`` (already safe) whose wrapped lines stay indented by ``pad``."""
    if not pad:
        return Text(text, style=style)
    return Padding(Text(text, style=style), (0, 0, 0, len(pad)))


def _message_lines(m: Mapping[str, Any], indent: int = 0) -> list[Any]:
    pad = "  " * indent
    role = str(m.get("role"))
    head = Text(pad)
    head.append(f"{safe(role)} ", style="bold blue" if role == "user" else "bold magenta")
    head.append(safe(m.get("id")), style="dim")
    out: list[Any] = [head]
    for p in m.get("parts", []):
        out.extend(_part_lines(p, indent + 1))
    return out


def state_panel(state: Mapping[str, Any], title: str) -> Panel:
    """A checked-out state: every message with its parts, then status and error."""
    lines: list[Any] = []
    for m in state.get("messages", []):
        lines.extend(_message_lines(m))
    foot = Text("status: ")
    foot.append_text(styled_status(str(state.get("status"))))
    err = state.get("error")
    if isinstance(err, Mapping):
        code = f" ({err['code']})" if err.get("code") else ""
        foot.append(f"   error: {safe(err.get('message'))}{safe(code)}", style="red")
    if not lines:
        lines.append(Text("(no messages)", style="dim"))
    return Panel(Group(*lines, Text(""), foot), title=Text(safe(title)), title_align="left")


def diff_view(d: Any) -> Group:
    """A coloured diff: base, added (green), removed (red), changed (yellow, with details).

    Long lines wrap inside their indentation, within the console's width.
    """
    out: list[Any] = []
    head = Text()
    head.append(safe(d.left), style="bold red")
    head.append("  ⟷  ")
    head.append(safe(d.right), style="bold green")
    out.append(head)
    if d.base is None:
        out.append(Text("no shared history", style="dim"))
    else:
        out.append(
            Text(
                f"base {safe(d.base)}   ({d.events_left} event(s) on the left, "
                f"{d.events_right} on the right since)",
                style="dim",
            )
        )
    if d.identical:
        out.append(Text("no differences", style="bold"))
        return Group(*out)
    for sign, ids, style in (("-", d.removed, "red"), ("+", d.added, "green")):
        for mid in ids:
            out.append(_hanging(sign, safe(d.summary(mid)), style))
    for c in d.details:
        out.append(_hanging("~", f"{safe(c.role)} {safe(c.id)}", "yellow"))
        for line in c.lines:
            style = "green" if line.startswith("+") else "red" if line.startswith("-") else ""
            out.append(Padding(Text(safe(line), style=style), (0, 0, 0, 4)))
    if d.status_left != d.status_right:
        st = Text("status ")
        st.append(safe(d.status_left), style="red")
        st.append(" → ")
        st.append(safe(d.status_right), style="green")
        out.append(st)
    if d.error_left != d.error_right:
        out.append(
            _hanging("error", f"{_err(d.error_left)} → {_err(d.error_right)}", "yellow")
        )
    return Group(*out)


def _hanging(mark: str, text: str, style: str) -> Table:
    """``mark`` then ``text`` (already safe), wrapped lines aligned after the mark."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row(Text(mark, style=style), Text(text, style=style))
    return grid


def diff_events(d: Any) -> Group:
    """The events on each side since the fork point (``diff --events``)."""
    out: list[Any] = []
    for label, ref, events, style in (
        ("left", d.left, d.left_events or (), "red"),
        ("right", d.right, d.right_events or (), "green"),
    ):
        out.append(
            Text(f"{label} {safe(ref)}: {len(events)} event(s) since the base", style=f"bold {style}")
        )
        for e in events:
            line = Text(f"  {e.version:>5} ", style=style)
            line.append(f"{safe(e.type):<9}", style="cyan")
            line.append(action_summary(e.action))
            out.append(line)
    return Group(*out)


def _err(e: Mapping[str, Any] | None) -> str:
    return "none" if not e else safe(repr(e.get("message")))
