"""The report's HTML: escaping, and the HTML of messages, tools, turns, trees and diffs.

Everything that comes from the log — texts, ids, actors, tool inputs and outputs — goes
through :func:`html.escape`: a stored ``<script>`` is shown as text, never run; and
invisible or control characters (a right-to-left override, a zero-width space) are shown
as escapes such as ``\\u202e``, so they cannot reorder or hide the text around them. The
page reads fully without its script: sections are ``<details>`` elements.

The explorer (:mod:`eventstore.explorer`) renders its pages with the same pieces; they
are listed at the end of this module. What the pages show is gathered by
:mod:`eventstore.features.report`; their look is :mod:`eventstore.features.report_style`.
"""

from __future__ import annotations

import html
import json
import shlex
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from eventstore.core.checkpoints import Checkpoint
from eventstore.core.diff import SessionDiff
from eventstore.core.records import RecordedEvent, SessionInfo, VerifyReport
from eventstore.core.reducer import fold_json
from eventstore.core.rewinds import is_kept_line
from eventstore.core.text import shorten, visible
from eventstore.core.turn_rules import INTERRUPTED
from eventstore.core.turn_view import Turn, turn_messages
from eventstore.features.report_style import CSP, CSS, SCRIPT

__all__ = [
    "SessionReport",
    "session_page",
    "page",
    "escape",
    "badge",
    "timing",
    "message_html",
    "turn_html",
    "tree_html",
    "verify_html",
    "event_summary",
    "json_text",
    "diff_html",
    "timestamp",
]


JSON = dict[str, Any]

# Turns start expanded up to this many; a longer session opens as a list of one-line summaries.
_OPEN_TURNS = 40
# JSON blocks and texts longer than this fold behind a summary line.
_FOLD_CHARS = 700
_FOLD_LINES = 14
# What a turn's outcome is called on the page (the turn view's terms are the state's).
_OUTCOME = {"idle": "finished", "streaming": "in progress", "error": "error", "stopped": "stopped"}
# A diff page lists at most this many events per side.
_DIFF_EVENTS = 2000


# -- small helpers -----------------------------------------------------------------------


def _e(value: Any) -> str:
    """Escape anything for HTML text or a quoted attribute; controls, bidi overrides and
    invisible characters are shown as visible escapes first (the CLI's rule), so text
    from the log cannot reorder or hide what surrounds it."""
    return html.escape(visible(value, multiline=True), quote=True)


def _ts(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _clock(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%H:%M:%S")


def _duration(seconds: float) -> str:
    if seconds < 0.001:
        return "<1 ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def _badge(text: str, kind: str | None = None) -> str:
    return f'<span class="badge b-{_e(kind or text)}">{_e(text)}</span>'


def _json_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    flat = json.dumps(value, ensure_ascii=False, default=str)
    # Small values read best on one line; larger ones indented.
    return flat if len(flat) <= 72 else json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _block(value: Any) -> str:
    """A ``<pre>`` of a JSON value or text, folded behind a summary line when long."""
    text = _json_text(value)
    pre = f"<pre>{_e(text)}</pre>"
    lines = text.count("\n") + 1
    if len(text) <= _FOLD_CHARS and lines <= _FOLD_LINES:
        return pre
    head = shorten(text, 70)
    return (
        f'<details class="fold"><summary><span class="mono">{_e(head)}</span> '
        f'<span class="muted">({lines} lines, {len(text):,} characters)</span></summary>{pre}</details>'
    )


def _text(text: str) -> str:
    """Message text as written (line breaks kept), folded when very long."""
    if len(text) <= _FOLD_CHARS * 4:
        return f'<div class="text">{_e(text)}</div>'
    return (
        f'<div class="text">{_e(text[:_FOLD_CHARS])}…</div><details class="fold">'
        f"<summary>show all {len(text):,} characters</summary>"
        f'<div class="text">{_e(text)}</div></details>'
    )


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_e(CSP)}">'
        '<meta name="referrer" content="no-referrer">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head>\n"
        f"<body><main>{body}"
        "<footer>Written by eventstore. Every text above comes from the event log and is shown "
        "as recorded, escaped; this page loads nothing and runs no code from the log.</footer>"
        f"</main><script>{SCRIPT}</script></body></html>\n"
    )


_CONTROLS = (
    '<div class="controls"><button type="button" id="expand-all">Expand all</button>'
    '<button type="button" id="collapse-all">Collapse all</button></div>'
)


# -- messages ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Timing:
    """When each tool call started and ended, by call id (from the events, not the state)."""

    started: Mapping[str, datetime]
    ended: Mapping[str, datetime]

    def of(self, call_id: str) -> str:
        a, b = self.started.get(call_id), self.ended.get(call_id)
        if a is None or b is None:
            return ""
        return f'<span class="muted" title="time taken">{_e(_duration((b - a).total_seconds()))}</span>'


def _timing(events: Iterable[RecordedEvent]) -> _Timing:
    started: dict[str, datetime] = {}
    ended: dict[str, datetime] = {}
    open_: list[str] = []
    for ev in events:
        part = ev.action.get("part") if ev.type == "part" else None
        kind = part.get("type") if isinstance(part, Mapping) else ev.type
        if kind == "tool-call" and isinstance(part, Mapping):
            started[str(part.get("id"))] = ev.recorded_at
            open_.append(str(part.get("id")))
        elif kind in ("tool-result", "tool-error") and isinstance(part, Mapping):
            ended[str(part.get("id"))] = ev.recorded_at
        elif kind in ("stop", "error") or (
            kind == "finish" and isinstance(part, Mapping) and part.get("reason") == "aborted"
        ):
            # Calls still open when a run stops or fails end there (they are cancelled).
            for call in open_:
                ended.setdefault(call, ev.recorded_at)
            open_ = []
    return _Timing(started, ended)


def _tool(part: Mapping[str, Any], timing: _Timing) -> str:
    state = str(part.get("state", "?"))
    out = [
        f'<div class="tool s-{_e(state)}"><div class="tool-head">'
        f'<span class="tname">{_e(part.get("name", "?"))}</span>'
        f'<code class="muted">{_e(part.get("id", "?"))}</code>{_badge(state)}{timing.of(str(part.get("id")))}'
        "</div>"
    ]
    if "prompt" in part:
        out.append(f'<div class="prompt">asks: <q>{_e(part["prompt"])}</q></div>')
    out.append('<div class="io">')
    out.append(f'<div class="label">input</div>{_block(part.get("input", {}))}')
    if "output" in part:
        out.append(f'<div class="label">output</div>{_block(part["output"])}')
    if "error" in part:
        out.append(f'<div class="label">error</div>{_block(part["error"])}')
    out.append("</div>")
    agent = part.get("agent")
    if isinstance(agent, Mapping):
        out.append(_agent(agent, timing))
    out.append("</div>")
    return "".join(out)


def _agent(agent: Mapping[str, Any], timing: _Timing) -> str:
    status = str(agent.get("status", "?"))
    out = [f'<div class="agent"><div class="role">sub-agent run {_badge(status)}</div>']
    out.extend(_message(m, timing) for m in agent.get("messages", []))
    err = agent.get("error")
    if isinstance(err, Mapping):
        out.append(_error_box(err))
    out.append("</div>")
    return "".join(out)


def _error_box(err: Mapping[str, Any]) -> str:
    code = f' <code>{_e(err["code"])}</code>' if "code" in err else ""
    return f'<div class="alert" role="alert"><strong>Error:</strong> {_e(err.get("message", ""))}{code}</div>'


def _message(m: Mapping[str, Any], timing: _Timing) -> str:
    role = str(m.get("role", "?"))
    out = [
        f'<div class="msg {_e(role)}"><div class="role">{_e(role)} '
        f'<span class="mono">{_e(m.get("id", ""))}</span></div>'
    ]
    for p in m.get("parts", []):
        kind = p.get("type")
        if kind == "text":
            out.append(_text(str(p.get("text", ""))))
        elif kind == "reasoning":
            out.append(
                f'<details class="reasoning"><summary>reasoning</summary>{_text(str(p.get("text", "")))}</details>'
            )
        elif kind == "tool":
            out.append(_tool(p, timing))
    if not m.get("parts"):
        out.append('<div class="empty">(no content)</div>')
    out.append("</div>")
    return "".join(out)


# -- turns ---------------------------------------------------------------------------------


def _notable(ev: RecordedEvent) -> tuple[str, str] | None:
    """(badge kind, description) for an event an auditor should see in the timeline."""
    a = ev.action
    if ev.type in ("stop", "retry", "reset"):
        return (ev.type if ev.type != "stop" else "stopped", ev.type)
    if ev.type == "toolPhase":
        prompt = f" — asks {shorten(str(a['prompt']), 120)!r}" if "prompt" in a else ""
        return (str(a.get("state")), f"tool {a.get('name')} → {a.get('state')}{prompt}")
    part = a.get("part")
    if ev.type != "part" or not isinstance(part, Mapping):
        return None
    where = f" in sub-agent run of {a['within']}" if "within" in a else ""
    if part.get("type") == "error":
        text = str(part.get("error", ""))
        code = f" ({part['code']})" if "code" in part else ""
        kind = "interrupted" if text == INTERRUPTED and "within" not in a else "error"
        return (kind, f"error{where}: {text}{code}")
    if part.get("type") == "tool-error":
        return ("error", f"tool {part.get('id')} failed{where}: {shorten(_json_text(part.get('error')), 160)}")
    if part.get("type") == "finish" and part.get("reason") not in (None, "stop"):
        return ("stopped", f"finish{where} ({part.get('reason')})")
    return None


def _is_interruption(ev: RecordedEvent) -> bool:
    part = ev.action.get("part")
    return (
        ev.type == "part"
        and "within" not in ev.action
        and isinstance(part, Mapping)
        and part.get("type") == "error"
        and part.get("error") == INTERRUPTED
    )


def _user_id(events: Sequence[RecordedEvent], state: Mapping[str, Any]) -> str | None:
    send = next((ev for ev in events if ev.type == "send"), None)
    if send is not None:
        return str(send.action.get("id"))
    if events and events[0].turn > 0:
        # A turn cut by a compaction baseline: its user message is the newest one before it.
        users = [m for m in state.get("messages", []) if m.get("role") == "user"]
        return str(users[-1].get("id")) if users else None
    return None


def _turn(
    session: str,
    row: Turn,
    events: Sequence[RecordedEvent],
    before: Mapping[str, Any] | None,
    after: Mapping[str, Any],
    open_: bool,
) -> str:
    timing = _timing(events)
    interrupted = any(_is_interruption(ev) for ev in events)
    user_id = _user_id(events, after)
    msgs = turn_messages(after, user_id)
    user_msgs = [m for m in msgs if m.get("role") == "user"]
    user_text = " ".join(
        str(p.get("text", "")) for m in user_msgs for p in m.get("parts", []) if p.get("type") == "text"
    )
    cls = f"turn o-{_e(row.outcome)}" + (" interrupted" if interrupted else "")
    label = f"Turn {row.turn}" if row.turn else "Before the first message"
    badges = [_badge(_OUTCOME.get(row.outcome, row.outcome), row.outcome)]
    if interrupted:
        badges.append(_badge("interrupted"))
    if row.retries:
        badges.append(_badge(f"{row.retries} retr{'y' if row.retries == 1 else 'ies'}", "retry"))
    if row.partial:
        badges.append(_badge("partial: starts before the baseline", "partial"))
    names = sorted({t.name for t in row.tools})
    tools = f'<span class="muted mono">{_e(", ".join(names))}</span>' if names else ""
    preview = shorten(user_text, 140) if user_text else ""
    out = [
        f'<details class="{cls}" id="turn-{row.turn}" data-turn="{row.turn}"{" open" if open_ else ""}>'
        f'<summary><span class="tno">{_e(label)}</span><span class="preview">{_e(preview)}</span>'
        f'{"".join(badges)}{tools}<span class="vers">v{row.first_version}–{row.last_version}</span></summary>'
        '<div class="turn-body">'
    ]
    took = _duration((row.ended - row.started).total_seconds())
    who = ", ".join(row.actors) or "unknown"
    out.append(
        f'<div class="meta">{_e(_ts(row.started))} · took {_e(took)} · by {_e(who)} · '
        f"versions {row.first_version}–{row.last_version} ({row.events} events) · "
        f"<code>eventstore checkout {_e(shlex.quote(f'{session}@{row.last_version}'))}</code></div>"
    )
    if interrupted:
        out.append(
            '<div class="alert" role="alert"><strong>Interrupted.</strong> The response to this turn '
            "never finished: crash recovery closed it with the error below.</div>"
        )
    # A retry or reset replaces what the turn had shown: each attempt it ended stays readable.
    state: Mapping[str, Any] | None = before
    k = 0
    for i, ev in enumerate(events):
        if ev.type not in ("retry", "reset"):
            continue
        state = fold_json(state, [dict(x.action) for x in events[k:i]])
        k = i
        shown = turn_messages(state, _user_id(events, state))
        body = "".join(_message(m, timing) for m in shown if m.get("role") != "user")
        err = state.get("error")
        if isinstance(err, Mapping) and state.get("status") == "error":
            body += _error_box(err)
        out.append(
            f'<details class="attempt"><summary>What the turn showed before the {_e(ev.type)} at '
            f"v{ev.version} ({_e(_clock(ev.recorded_at))})</summary>{body or '<div class=empty>(nothing)</div>'}"
            "</details>"
        )
    out.extend(_message(m, timing) for m in msgs)
    if row.error is not None:
        err = after.get("error")
        out.append(_error_box(err if isinstance(err, Mapping) else {"message": row.error}))
    notes = [(ev, n) for ev in events if (n := _notable(ev)) is not None]
    if notes:
        out.append('<ol class="timeline">')
        for ev, (kind, text) in notes:
            out.append(
                f"<li><span class=mono>v{ev.version}</span> {_e(_clock(ev.recorded_at))} "
                f"{_badge(kind)} {_e(text)}"
                f'{" <span class=muted>by " + _e(ev.actor) + "</span>" if ev.actor else ""}</li>'
            )
        out.append("</ol>")
    out.append(_natives(events))
    out.append("</div></details>")
    return "".join(out)


def _natives(events: Sequence[RecordedEvent]) -> str:
    """The turn's provider-native data (the exact text each event carries), folded: it is
    evidence of what the provider sent, not part of the conversation."""
    carrying = [ev for ev in events if ev.native_bytes is not None]
    if not carrying:
        return ""
    items = "".join(
        f"<li><span class=mono>v{ev.version}</span> {_e(ev.type)}"
        f"{_block(ev.native_bytes.decode('utf-8', 'replace'))}</li>"
        for ev in carrying
        if ev.native_bytes is not None
    )
    return (
        f'<details class="native"><summary>Provider-native data ({len(carrying)} '
        f"event{'s' if len(carrying) != 1 else ''})</summary><ol class=timeline>{items}</ol></details>"
    )


# -- header --------------------------------------------------------------------------------


def _tree(
    infos: Sequence[SessionInfo],
    current: str,
    link: Callable[[str], str] | None = None,
    mark: str = " ← this report",
) -> str:
    """The branch tree of ``current``'s family: root first, each branch with its fork point
    (each id a link to ``link(id)`` when given)."""
    by_id = {s.id: s for s in infos}
    children: dict[str | None, list[SessionInfo]] = {}
    for s in infos:
        children.setdefault(s.parent if s.parent in by_id else None, []).append(s)
    root = by_id[current]
    seen = {root.id}
    while root.parent in by_id and root.parent not in seen:
        root = by_id[root.parent]
        seen.add(root.id)

    def node(s: SessionInfo, depth: int) -> str:
        here = ' class="here"' if s.id == current else ""
        fork = f" forked at v{s.fork_version}" if s.parent is not None else ""
        if is_kept_line(s.id, s.parent):
            fork = f" kept by a rewind of {s.parent} to v{s.fork_version}"
        note = mark if s.id == current else ""
        name = f"<span{here}>{_e(s.id)}</span>"
        if link is not None and s.id != current:
            name = f'<a href="{_e(link(s.id))}">{name}</a>'
        kids = children.get(s.id, []) if depth < 50 else []
        sub = "".join(node(c, depth + 1) for c in kids)
        return (
            f"<li>{name} <span class=muted>head v{s.head}{_e(fork)}"
            f"{f', baseline v{s.baseline}' if s.baseline else ''}{_e(note)}</span>"
            f'{f"<ul class=tree>{sub}</ul>" if sub else ""}</li>'
        )

    return f'<ul class="tree root">{node(root, 0)}</ul>'


def _verify(report: VerifyReport) -> str:
    erased = "".join(f"<li>{_e(n.message)}</li>" for n in report.notices)
    erased = f'<p class="muted">Erased or rewound through the API:</p><ul>{erased}</ul>' if erased else ""
    # Title, owner and metadata live outside the hash chain: their record is the audit.
    info = "".join(
        f"<li>{_e(_ts(c.changed_at))} by {_e(c.actor or '(none)')} on <code>{_e(c.session)}</code>: "
        + "; ".join(f"{_e(k)} = {_e(_json_text(v))}" for k, v in c.changes.items())
        + "</li>"
        for c in report.info_changes
    )
    if info:
        erased += f'<p class="muted">Title, owner or metadata set (recorded, outside the hash chain):</p><ul>{info}</ul>'
    if report.ok:
        return (
            f"{_badge('ok')} hash chain and snapshots check out "
            f"<span class=muted>({report.events} events, {report.snapshots} snapshots checked)</span>"
            + erased
        )
    items = "".join(f"<li>{_e(p.message)}</li>" for p in report.problems)
    return f"{_badge('problems found', 'bad')}<ul>{items}</ul>{erased}"


def _checkpoint(checkpoint: Checkpoint | None, report: VerifyReport) -> str:
    if checkpoint is None:
        return '<span class="empty">none used: checked against the hash chain only</span>'
    verdict = _badge("extended", "ok") if report.ok else _badge("not extended", "bad")
    return (
        f"{verdict} signed checkpoint of {_e(_ts(checkpoint.created_at))} "
        f"<span class=muted>(origin {_e(checkpoint.origin)}, {len(checkpoint.sessions):,} "
        "sessions anchored)</span>"
    )


@dataclass(frozen=True)
class SessionReport:
    """What the session page shows, as :func:`eventstore.features.report.render_report`
    gathered it.

    Attributes:
        session: the session id.
        version: the version asked for (``None``: the head).
        upto: the version shown.
        info: the session's entry; ``infos``: every session's (for the branch tree).
        start: the state at the session's baseline (``None``: no baseline).
        events: the events after the baseline up to ``upto``.
        turns: those events as turns; ``states``: the state after each turn.
        checked: the session's verify result.
        checkpoint: the signed checkpoint the verify result was asked to prove, if any.
    """

    session: str
    version: int | None
    upto: int
    info: SessionInfo
    infos: list[SessionInfo]
    start: JSON | None
    events: list[RecordedEvent]
    turns: list[Turn]
    states: list[JSON]
    checked: VerifyReport
    checkpoint: Checkpoint | None


def session_page(r: SessionReport) -> str:
    """The audit report page of a session (see :class:`SessionReport`)."""
    session, version, upto, info, infos = r.session, r.version, r.upto, r.info, r.infos
    start, events, turns, states, checked, checkpoint = (
        r.start, r.events, r.turns, r.states, r.checked, r.checkpoint
    )
    actors = Counter(ev.actor or "(none)" for ev in events)
    first = events[0].version if events else 0
    as_of = "head" if version is None else f"as it was at v{upto} (head is v{info.head})"
    facts = [
        ("Session", f"<code>{_e(session)}</code>"),
        ("Version", f"v{upto} · {_e(as_of)}"),
        ("Created", _e(_ts(info.created_at))),
        ("Turns", f"{len(turns)} · {len(events):,} events shown"),
        (
            "Actors",
            ", ".join(f"{_e(a)} <span class=muted>({n})</span>" for a, n in actors.most_common())
            or '<span class="empty">none</span>',
        ),
        ("Verify", _verify(checked)),
        ("Checkpoint", _checkpoint(checkpoint, checked)),
    ]
    if info.parent is not None:
        facts.insert(3, ("Forked from", f"<code>{_e(info.parent)}@{info.fork_version}</code>"))
    if info.baseline:
        facts.append(("Compacted", f"events before v{info.baseline} were folded into a baseline"))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    body = [
        f"<h1>Session <span class=mono>{_e(session)}</span></h1>",
        f'<p class="sub">Audit report · rendered from the event log · v{upto}</p>',
        f'<div class="top"><section class="card"><dl class="facts">{dl}</dl></section>'
        f'<section class="card"><h2>Branches</h2>{_tree(infos, session)}</section></div>',
        f"<h2>Turns</h2>{_CONTROLS}",
    ]
    open_ = len(turns) <= _OPEN_TURNS
    prev: Mapping[str, Any] | None = start
    for row, after in zip(turns, states):
        lo, hi = row.first_version - first, row.last_version - first + 1
        body.append(_turn(session, row, events[lo:hi], prev, after, open_))
        prev = after
    if not turns:
        body.append('<p class="empty">No events recorded up to this version.</p>')
    return _page(f"eventstore report: {session}@{upto}", "".join(body))


# -- diff ----------------------------------------------------------------------------------


def _event_what(ev: RecordedEvent) -> str:
    """One event in a few words: its type and the text or name it carries (not escaped)."""
    a = ev.action
    if ev.type == "send":
        return f"send {shorten(str(a.get('text', '')), 100)!r}"
    if ev.type == "part" and isinstance(a.get("part"), Mapping):
        p = a["part"]
        what = f"part {p.get('type')}"
        detail = p.get("name") or p.get("text") or p.get("error")
        if detail is not None:
            what += f" {shorten(_json_text(detail), 80)!r}"
        if "within" in a:
            what += f" within {a['within']}"
        return what
    return ev.type


def _event_rows(events: Sequence[Any]) -> str:
    if not events:
        return '<p class="empty">none</p>'
    rows = []
    for ev in events[:_DIFF_EVENTS]:
        rows.append(
            f"<tr><td class=mono>v{ev.version}</td><td>{_e(_ts(ev.recorded_at))}</td>"
            f"<td>{_e(ev.actor or '')}</td><td>{_e(_event_what(ev))}</td></tr>"
        )
    more = len(events) - _DIFF_EVENTS
    tail = f'<p class="muted">… and {more:,} more: use <code>eventstore history</code>.</p>' if more > 0 else ""
    table = (
        "<table><thead><tr><th>version</th><th>recorded</th><th>actor</th><th>event</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>{tail}"
    )
    if len(events) <= _FOLD_LINES * 4:
        return table
    return f'<details class="fold"><summary>{len(events):,} events</summary>{table}</details>'


def _diff_body(d: SessionDiff) -> str:
    """The diff page's content, from a diff made with ``events=True``."""
    timing = _timing([*(d.left_events or ()), *(d.right_events or ())])
    base = f"<code>{_e(d.base)}</code>" if d.base else '<span class="empty">no shared history</span>'
    facts = [
        ("A", f"<code>{_e(d.left)}</code> {_badge(d.status_left)} · {d.events_left} event(s) since the base"),
        ("B", f"<code>{_e(d.right)}</code> {_badge(d.status_right)} · {d.events_right} event(s) since the base"),
        ("Shared base", base),
        (
            "Messages",
            f"{len(d.added)} only in B · {len(d.removed)} only in A · {len(d.changed)} changed",
        ),
    ]
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    body = [
        f"<h1>Diff <span class=mono>{_e(d.left)}</span> → <span class=mono>{_e(d.right)}</span></h1>",
        '<p class="sub">Audit report · what differs between two points of the log</p>',
        f'<section class="card"><dl class="facts">{dl}</dl></section>',
    ]
    if d.identical:
        body.append('<p class="empty">The two states are identical.</p>')
    for err, side in ((d.error_left, "A"), (d.error_right, "B")):
        if err:
            body.append(f"<p>{side} ends in an error:</p>{_error_box(err)}")

    def section(title: str, ids: Sequence[str], pool: Mapping[str, JSON], cls: str) -> None:
        if not ids:
            return
        body.append(f"<h2>{_e(title)}</h2>")
        body.extend(f'<div class="{cls}">{_message(pool.get(k, {"id": k}), timing)}</div>' for k in ids)

    section("Only in A (removed on the way to B)", d.removed, d.left_messages, "diff-del")
    section("Only in B (added on the way from A)", d.added, d.right_messages, "diff-add")
    if d.details:
        body.append("<h2>Changed messages</h2>")
        for c in d.details:
            lines = "".join(f"<li>{_e(line)}</li>" for line in c.lines)
            body.append(
                f'<div class="card diff-chg"><div class="role">{_e(c.role)} <span class=mono>{_e(c.id)}</span>'
                f"</div><ul>{lines}</ul>"
                f'<details class="fold"><summary>both versions</summary>'
                f"{_message(d.left_messages.get(c.id, {}), timing)}"
                f"{_message(d.right_messages.get(c.id, {}), timing)}</details></div>"
            )
    body.append(f"<h2>Events on A since the base</h2>{_event_rows(d.left_events or ())}")
    body.append(f"<h2>Events on B since the base</h2>{_event_rows(d.right_events or ())}")
    return "".join(body)


# -- the pieces other pages render with ----------------------------------------------------
# The explorer serves the same look and the same escaping from a live server: it calls
# these rather than keeping a second copy of the rendering.

page = _page
escape = _e
badge = _badge
timing = _timing
message_html = _message
turn_html = _turn
tree_html = _tree
verify_html = _verify
event_summary = _event_what
json_text = _json_text
diff_html = _diff_body
timestamp = _ts
