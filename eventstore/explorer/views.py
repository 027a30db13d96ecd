"""The explorer's pages, rendered on the server with the audit report's pieces.

Every value from the log goes through :func:`eventstore.features.report_html.escape` (HTML
escaped, invisible and control characters spelled out). A page links one style sheet and
one script, both served by the explorer itself; nothing is inline, so the server's
Content-Security-Policy can forbid every inline script and style.

Cost: a session page reads the state at one version (a snapshot plus a short tail), the
events of the one turn that version falls in, and the session list for the branch tree;
never the whole log. The history is read one page at a time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from eventstore.core.records import RecordedEvent, SessionInfo, VerifyReport
from eventstore.core.reducer import fold_json
from eventstore.core.text import shorten
from eventstore.core.turn_view import build_turns, turn_messages
from eventstore.explorer.reads import owner_of, title_of, updated_of
from eventstore.features.report_html import (
    badge,
    diff_html,
    escape,
    event_summary,
    message_html,
    timestamp,
    timing,
    tree_html,
    turn_html,
    verify_html,
)

if TYPE_CHECKING:
    from eventstore import EventStore, SessionDiff, SessionPage

__all__ = [
    "page",
    "session_href",
    "catalogue_body",
    "session_body",
    "view_html",
    "verify_fragment",
    "history_body",
    "diff_form",
    "diff_body",
    "error_body",
]

JSON = dict[str, Any]
# The turn a version falls in is read backwards in slices of this many events.
_SLICE = 256


def session_href(session: str, tail: str = "", **query: Any) -> str:
    """The explorer's URL of a session page (``tail``: ``/history``, ``/report``, ...).

    The id is percent-encoded whole (a ``/`` in it too), so any id names one page.
    """
    q = {k: v for k, v in query.items() if v is not None}
    return f"/sessions/{quote(session, safe='')}{tail}" + (f"?{urlencode(q)}" if q else "")


def page(title: str, body: str, *, session: str | None = None) -> str:
    """A whole page: the header with its links, then ``body``."""
    nav = ['<a href="/">Sessions</a>']
    if session is not None:
        nav += [
            f'<a href="{escape(session_href(session))}">Turns</a>',
            f'<a href="{escape(session_href(session, "/history"))}">History</a>',
            f'<a href="{escape(session_href(session, "/report"))}">Report</a>',
        ]
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="referrer" content="no-referrer">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{escape(title)}</title>"
        '<link rel="stylesheet" href="/static/report.css">'
        '<link rel="stylesheet" href="/static/explorer.css">'
        '<script src="/static/explorer.js" defer></script></head>\n'
        f'<body><header class="bar"><strong>eventstore explorer</strong> <nav>{" ".join(nav)}</nav>'
        "<span class=muted>read-only</span></header><main>"
        f"{body}</main></body></html>\n"
    )


def error_body(status: int, message: str) -> str:
    """The content of an error page."""
    return (
        f'<h1>{status} · {escape("Not found" if status == 404 else "Cannot show this")}</h1>'
        f'<div class="alert" role="alert">{escape(message)}</div><p><a href="/">Back to the sessions</a></p>'
    )


# -- the catalogue ---------------------------------------------------------------------------


def catalogue_body(
    listing: SessionPage, *, query: str | None, owner: str | None, status: str | None, limit: int
) -> str:
    """The session list: the search form, one row per session, the next page's link."""
    options = "".join(
        f'<option value="{s}"{" selected" if s == status else ""}>{s or "any status"}</option>'
        for s in ("", "idle", "streaming", "error", "closed")
    )
    form = (
        '<form class="search" method="get" action="/">'
        f'<input type="search" name="q" id="q" placeholder="Search titles" value="{escape(query or "")}">'
        f'<input type="text" name="owner" id="owner" placeholder="Owner" value="{escape(owner or "")}">'
        f'<select name="status" id="status">{options}</select>'
        f'<input type="hidden" name="limit" value="{limit}"><button type="submit">Search</button></form>'
    )
    rows = []
    for s in listing.items:
        title = title_of(s)
        rows.append(
            f'<tr><td><a class="sid" href="{escape(session_href(s.id))}">{escape(s.id)}</a></td>'
            f"<td>{escape(title) if title else '<span class=empty>untitled</span>'}</td>"
            f"<td>{escape(owner_of(s) or '')}</td><td class=mono>v{s.head}</td>"
            f"<td>{escape(s.parent + '@' + str(s.fork_version)) if s.parent else ''}</td>"
            f"<td>{escape(timestamp(updated_of(s)))}</td>"
            f"<td>{badge('closed', 'stopped') if s.closed else ''}</td></tr>"
        )
    table = (
        '<table class="catalogue"><thead><tr><th>session</th><th>title</th><th>owner</th><th>head</th>'
        "<th>forked from</th><th>updated</th><th></th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
        if rows
        else '<p class="empty">No session matches.</p>'
    )
    more = ""
    if listing.next_cursor is not None:
        q = {"q": query, "owner": owner, "status": status, "limit": limit, "cursor": listing.next_cursor}
        href = "/?" + urlencode({k: v for k, v in q.items() if v})
        more = f'<p><a id="next-page" href="{escape(href)}">Next page →</a></p>'
    return f"<h1>Sessions</h1>{form}{table}{more}"


# -- one session ---------------------------------------------------------------------------


def _turn_events(store: EventStore, session: str, version: int) -> list[RecordedEvent]:
    """The events of the turn ``version`` falls in, up to ``version``, oldest first."""
    out: list[RecordedEvent] = []
    turn: int | None = None
    upto = version
    while upto > 0:
        got = list(store.history(session, upto=upto, desc=True, limit=_SLICE))
        for ev in got:
            if turn is None:
                turn = ev.turn
            elif ev.turn != turn:
                out.reverse()
                return out
            out.append(ev)
        if len(got) < _SLICE:
            break
        upto = got[-1].version - 1
    out.reverse()
    return out


def view_html(store: EventStore, session: str, version: int) -> str:
    """The conversation at ``version``: earlier turns folded, the turn it falls in in full.

    The last turn is rendered as the audit report renders a turn (who and when, tool calls
    and their timing, stops, retries and errors); the earlier ones are the messages of the
    state at ``version``, one fold per turn, closed.
    """
    state: JSON = store.load(session, version=version).to_json()
    events = _turn_events(store, session, version)
    messages: list[Mapping[str, Any]] = list(state.get("messages", []))
    out = [f'<div id="view" data-version="{version}">']
    current = ""
    earlier = messages
    if events:
        first = events[0].version
        before = None if first == 1 else store.load(session, version=first - 1).to_json()
        states: list[JSON] = []

        def fold(s: JSON | None, actions: list[JSON]) -> JSON:
            new = fold_json(s, actions)
            states.append(new)
            return new

        row = build_turns(events, before, fold=fold)[0]
        send = next((ev for ev in events if ev.type == "send"), None)
        user_id = str(send.action.get("id")) if send is not None else None
        if send is None and row.turn > 0:
            # The turn began before a compaction baseline: its user message is the newest one.
            users = [m for m in messages if m.get("role") == "user"]
            user_id = str(users[-1].get("id")) if users else None
        mine = turn_messages(state, user_id)
        if mine:
            start = next(i for i, m in enumerate(messages) if m is mine[0])
            earlier = messages[:start]
        current = turn_html(session, row, events, before, states[-1], True)
    groups: list[list[Mapping[str, Any]]] = []
    for m in earlier:
        if m.get("role") == "user" or not groups:
            groups.append([])
        groups[-1].append(m)
    none = timing(())
    for i, group in enumerate(groups, 1):
        user = next((m for m in group if m.get("role") == "user"), None)
        text = " ".join(
            str(p.get("text", "")) for p in (user or {}).get("parts", []) if p.get("type") == "text"
        )
        body = "".join(message_html(m, none) for m in group)
        out.append(
            f'<details class="turn earlier"><summary><span class="tno">Earlier turn {i}</span>'
            f'<span class="preview">{escape(shorten(text, 140))}</span></summary>'
            f'<div class="turn-body">{body}</div></details>'
        )
    out.append(current)
    if not messages and not events:
        out.append('<p class="empty">Nothing recorded up to this version.</p>')
    if state.get("status") == "error" and not current and isinstance(state.get("error"), Mapping):
        out.append(f'<div class="alert">{escape(state["error"].get("message", ""))}</div>')
    out.append("</div>")
    return "".join(out)


def verify_fragment(report: VerifyReport | None, session: str, head: int) -> str:
    """The verify result, or a placeholder the page's script fills in (``None``: not yet checked)."""
    src = escape(session_href(session, "/verify", head=head))
    if report is None:
        return (
            f'<div id="verify" data-src="{src}"><span class="muted">checking…</span> '
            f'<a href="{src}">check now</a></div>'
        )
    return f'<div id="verify">{verify_html(report)}</div>'


def session_body(
    store: EventStore,
    session: str,
    version: int,
    info: SessionInfo,
    infos: Sequence[SessionInfo],
    kept: Sequence[SessionInfo],
    verified: VerifyReport | None,
) -> str:
    """The session page: facts, the scrubber, branches and kept lines, the verify result, the view."""
    title = title_of(info)
    forks = sorted(
        {s.fork_version for s in infos if s.parent == session and s.fork_version}
        | {k.fork_version for k in kept if k.fork_version}
    )
    facts = [
        ("Session", f"<code>{escape(session)}</code>"),
        ("Title", escape(title) if title else '<span class="empty">untitled</span>'),
        ("Owner", escape(owner_of(info) or "—")),
        ("Head", f'<span id="head">v{info.head}</span>'),
        ("Created", escape(timestamp(info.created_at))),
        ("Verify", verify_fragment(verified, session, info.head)),
    ]
    if info.parent is not None:
        facts.insert(3, ("Forked from", f'<a href="{escape(session_href(info.parent, v=info.fork_version))}">'
                         f"<code>{escape(info.parent)}@{info.fork_version}</code></a>"))
    if info.baseline:
        facts.append(("Compacted", f"versions before v{info.baseline} were folded into a baseline"))
    if info.closed:
        facts.append(("Closed", escape(info.closed_reason or "closed to writes")))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    ticks = "".join(f'<option value="{v}"></option>' for v in forks)
    scrub = (
        f'<form class="scrub card" method="get" action="{escape(session_href(session))}" '
        f'data-session="{escape(session)}" data-view="{escape(session_href(session, "/view"))}" '
        f'data-events="{escape(session_href(session, "/events"))}">'
        f'<label for="scrub">Version</label>'
        f'<button type="button" id="prev" title="previous version (←)">←</button>'
        f'<input type="range" id="scrub" name="v" min="{info.baseline}" max="{info.head}" '
        f'value="{version}" list="forks">'
        f'<button type="button" id="next" title="next version (→)">→</button>'
        f'<output id="shown" for="scrub">v{version}</output> <span class="muted">of</span> '
        f'<span class="muted" id="of">v{info.head}</span>'
        f'<label class="follow"><input type="checkbox" id="live"{" checked" if version == info.head else ""}>'
        " follow new events</label>"
        f'<noscript><input type="number" name="v" min="{info.baseline}" max="{info.head}" value="{version}">'
        '<button type="submit">Show</button></noscript>'
        f'<datalist id="forks">{ticks}</datalist></form>'
    )
    lines_html = ""
    if kept:
        items = "".join(
            f'<li><a href="{escape(session_href(k.id))}"><code>{escape(k.id)}</code></a> '
            f'<span class="muted">kept at v{k.fork_version}, head v{k.head}</span></li>'
            for k in kept
        )
        lines_html = f"<h2>Kept lines</h2><ul class=tree>{items}</ul>"
    diff_link = ""
    if info.parent is not None:
        href = "/diff?" + urlencode({"a": f"{info.parent}", "b": session})
        diff_link = f'<p><a href="{escape(href)}">Diff against {escape(info.parent)}</a></p>'
    tree = tree_html(infos, session, link=lambda s: session_href(s), mark=" ← this session")
    return (
        f"<h1>Session <span class=mono>{escape(session)}</span></h1>"
        f'<div class="top"><section class="card"><dl class="facts">{dl}</dl></section>'
        f'<section class="card"><h2>Branches</h2>{tree}{lines_html}{diff_link}</section></div>'
        f"{scrub}<h2>Turns</h2>{view_html(store, session, version)}"
    )


# -- history and diff ------------------------------------------------------------------------


def history_body(
    session: str, events: Sequence[RecordedEvent], *, after: int, limit: int, baseline: int, head: int
) -> str:
    """One page of events, each expandable to its JSON, with links to the pages around it."""
    rows = []
    for ev in events:
        doc = json.dumps(ev.to_json(), indent=2, ensure_ascii=False, default=str)
        rows.append(
            f'<details class="event" id="e{ev.version}"><summary><a class="mono" '
            f'href="{escape(session_href(session, v=ev.version))}">v{ev.version}</a> '
            f"<span class=muted>{escape(timestamp(ev.recorded_at))}</span> "
            f"<span class=muted>{escape(ev.actor or '')}</span> {escape(event_summary(ev))}</summary>"
            f"<pre>{escape(doc)}</pre></details>"
        )
    nav = []
    if after > baseline:
        nav.append(
            f'<a id="prev-page" href="{escape(session_href(session, "/history", after=max(baseline, after - limit), limit=limit))}">← Earlier</a>'
        )
    if events and events[-1].version < head:
        nav.append(
            f'<a id="next-page" href="{escape(session_href(session, "/history", after=events[-1].version, limit=limit))}">Later →</a>'
        )
    shown = f"v{events[0].version}–v{events[-1].version}" if events else "none"
    return (
        f"<h1>History of <span class=mono>{escape(session)}</span></h1>"
        f'<p class="sub">Events {shown} of v{baseline + 1}–v{head}</p>'
        f'<div class="pager">{" ".join(nav)}</div>'
        f'{"".join(rows) or "<p class=empty>No events here.</p>"}'
        f'<div class="pager">{" ".join(nav)}</div>'
    )


def diff_form(a: str, b: str) -> str:
    """The form naming the two refs to compare."""
    return (
        '<h1>Diff</h1><form class="search" method="get" action="/diff">'
        f'<input type="text" name="a" id="a" value="{escape(a)}" placeholder="SESSION[@V]">'
        f'<input type="text" name="b" id="b" value="{escape(b)}" placeholder="SESSION[@V]">'
        '<button type="submit">Compare</button></form>'
    )


def diff_body(d: SessionDiff, a: str, b: str) -> str:
    """The diff page: the form with the two refs, then the report's diff."""
    return diff_form(a, b) + diff_html(d)
