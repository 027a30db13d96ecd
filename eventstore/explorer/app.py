"""The explorer's web application: read-only routes over one store.

Routes (a session id is percent-encoded as one path segment, so any id works):

- ``GET /`` — the catalogue: ``q`` (title search), ``owner``, ``status``, ``limit``, ``cursor``;
- ``GET /sessions/{id}`` — the turn view at ``v`` (default: the head) with the scrubber;
- ``GET /sessions/{id}/view?v=N`` — that view alone, the fragment the scrubber swaps in;
- ``GET /sessions/{id}/verify`` — the verify result (computed once per head, then cached);
- ``GET /sessions/{id}/events?after=N`` — server-sent events, one per new event;
- ``GET /sessions/{id}/history?after=N&limit=L`` — one page of events;
- ``GET /sessions/{id}/report?v=N`` — the full audit report;
- ``GET /diff?a=REF&b=REF`` — the difference of two refs (``SESSION[@V]``);
- ``GET /static/...`` — the style sheets and the one script.

Every response carries a strict Content-Security-Policy (the page's own origin only, no
inline script or style), ``nosniff`` and ``no-referrer``. Store errors become a 404 or
400 page; anything else a bare 500 page, never a traceback.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from importlib import resources
from threading import Lock
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eventstore.core.ids import split_ref
from eventstore.core.records import RecordedEvent, SessionInfo, VerifyReport
from eventstore.errors import (
    EventStoreError,
    InvalidEvent,
    SessionErased,
    SessionNotFound,
    VersionNotFound,
)
from eventstore.explorer.views import (
    catalogue_body,
    diff_body,
    diff_form,
    error_body,
    history_body,
    page,
    session_body,
    verify_fragment,
    view_html,
)
from eventstore.explorer.reads import lines, list_sessions
from eventstore.features.report_style import CSP as REPORT_CSP
from eventstore.features.report_style import CSS as REPORT_CSS

if TYPE_CHECKING:
    from eventstore import EventStore, Follower

__all__ = ["create_app", "CSP"]

#: Sent with every page: only this server's own files, no inline code, no framing.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_STATIC = {
    "explorer.js": "application/javascript; charset=utf-8",
    "explorer.css": "text/css; charset=utf-8",
}
_PAGE_LIMIT = 50
_HISTORY_LIMIT = 100
_MAX_LIMIT = 1000
# A live stream's follower gives up after this many idle seconds and a new one takes
# over, so a closed page's thread ends soon after.
_IDLE = 1.0
_VERIFIED = 128


class _Headers:
    """Adds the security headers to every response (a page may set its own policy)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                extra = [
                    (b"content-security-policy", CSP.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY"),
                ]
                headers += [(k, v) for k, v in extra if k not in names]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


def _int(request: Request, name: str, default: int | None, *, low: int = 0, high: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidEvent(f"{name} must be a whole number, got {raw!r}", field=name) from None
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise InvalidEvent(f"{name} must be {bound}, got {value}", field=name)
    return value


def _text(request: Request, name: str) -> str | None:
    value = request.query_params.get(name)
    return value or None


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers={"Cache-Control": "no-store"})


def _error_page(status: int, message: str) -> HTMLResponse:
    return _html(page(f"{status} · eventstore explorer", error_body(status, message)), status)


def create_app(store: EventStore, *, allowed_hosts: Sequence[str] | None = None) -> Starlette:
    """The explorer as an ASGI application over ``store`` (which the caller keeps and closes).

    Args:
        store: the store to show; the application only reads it.
        allowed_hosts: the ``Host`` header values accepted (``None``: any). A server on
            loopback should accept only loopback names, so a web page elsewhere cannot
            reach it through a DNS name that resolves to 127.0.0.1.

    Returns:
        A Starlette application.
    """
    verified: OrderedDict[tuple[str, int], VerifyReport] = OrderedDict()
    lock = Lock()

    def info_of(session: str) -> tuple[SessionInfo, list[SessionInfo]]:
        store.head(session)  # SessionNotFound / SessionErased, and a valid id, first
        infos = store.sessions()
        for s in infos:
            if s.id == session:
                return s, infos
        raise SessionNotFound(session)  # erased or removed between the two reads

    def cached_verify(session: str, head: int) -> VerifyReport | None:
        with lock:
            return verified.get((session, head))

    def verify(session: str, head: int) -> VerifyReport:
        got = cached_verify(session, head)
        if got is None:
            got = store.verify(session)
            with lock:
                verified[(session, head)] = got
                while len(verified) > _VERIFIED:
                    verified.popitem(last=False)
        return got

    def version_of(request: Request, info: SessionInfo) -> int:
        v = _int(request, "v", None)
        if v is None:
            return info.head
        store.load(info.id, version=v)  # VersionNotFound / CompactedError before any rendering
        return v

    def catalogue(request: Request) -> Response:
        query, owner, status = _text(request, "q"), _text(request, "owner"), _text(request, "status")
        limit = _int(request, "limit", _PAGE_LIMIT, low=1, high=_MAX_LIMIT) or _PAGE_LIMIT
        listing = list_sessions(
            store, owner=owner, query=query, status=status, limit=limit, cursor=_text(request, "cursor")
        )
        body = catalogue_body(listing, query=query, owner=owner, status=status, limit=limit)
        return _html(page("Sessions · eventstore explorer", body))

    def session_page(request: Request, session: str) -> Response:
        info, infos = info_of(session)
        version = version_of(request, info)
        body = session_body(
            store, session, version, info, infos, lines(store, session), cached_verify(session, info.head)
        )
        return _html(page(f"{session}@{version} · eventstore explorer", body, session=session))

    def view(request: Request, session: str) -> Response:
        info, _ = info_of(session)
        return _html(view_html(store, session, version_of(request, info)))

    def verify_route(request: Request, session: str) -> Response:
        head = store.head(session)
        return _html(verify_fragment(verify(session, head), session, head))

    def history(request: Request, session: str) -> Response:
        info, _ = info_of(session)
        after = _int(request, "after", info.baseline) or 0
        limit = _int(request, "limit", _HISTORY_LIMIT, low=1, high=_MAX_LIMIT) or _HISTORY_LIMIT
        after = max(after, info.baseline)
        if after > info.head:
            raise VersionNotFound(session, after, info.head)
        events = list(store.history(session, after=after, limit=limit))
        body = history_body(session, events, after=after, limit=limit, baseline=info.baseline, head=info.head)
        return _html(page(f"History of {session} · eventstore explorer", body, session=session))

    def report(request: Request, session: str) -> Response:
        info, _ = info_of(session)
        text = store.report(session, version_of(request, info) if "v" in request.query_params else None)
        # The report is a page of its own: its inline style and script are allowed by its policy.
        return HTMLResponse(text, headers={"Content-Security-Policy": REPORT_CSP, "Cache-Control": "no-store"})

    async def events(request: Request, session: str) -> Response:
        head = await anyio.to_thread.run_sync(store.head, session)
        last_id = request.headers.get("last-event-id")
        after = _int(request, "after", head) if not last_id else int(last_id) if last_id.isdigit() else head
        after = min(after if after is not None else head, head)

        async def stream() -> AsyncIterator[bytes]:
            last = after
            yield b"retry: 1000\n\n"
            while True:
                try:
                    follower: Follower = await anyio.to_thread.run_sync(_follow, store, session, last)
                    while True:
                        ev = await anyio.to_thread.run_sync(_next, follower, abandon_on_cancel=True)
                        if ev is None:
                            break
                        last = ev.version
                        yield _sse(ev)
                except EventStoreError as exc:
                    # The session was rewound, erased or compacted under the stream: say so and end.
                    doc = json.dumps({"error": type(exc).__name__, "message": str(exc)})
                    yield f"event: gone\ndata: {doc}\n\n".encode()
                    return
                yield b": idle\n\n"

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        )

    routes: dict[str, Callable[[Request, str], Response]] = {
        "": session_page,
        "view": view,
        "verify": verify_route,
        "history": history,
        "report": report,
    }

    async def sessions_route(request: Request) -> Response:
        # The raw path keeps a percent-encoded "/" inside an id apart from the route's own.
        raw = request.scope.get("raw_path") or request.url.path.encode()
        parts = raw.decode("latin-1").split("?", 1)[0].split("/")[2:]
        if not parts or not parts[0] or len(parts) > 2:
            raise HTTPException(404, "no such page")
        session = unquote(parts[0], errors="strict")
        what = parts[1] if len(parts) == 2 else ""
        if what == "events":
            return await events(request, session)
        handler = routes.get(what)
        if handler is None:
            raise HTTPException(404, "no such page")
        return await anyio.to_thread.run_sync(handler, request, session)

    def diff(request: Request) -> Response:
        a, b = _text(request, "a"), _text(request, "b")
        if a is None or b is None:
            body = diff_form(a or "", b or "")
            return _html(page("Diff · eventstore explorer", body))
        d = store.diff(split_ref(a), split_ref(b), events=True)
        return _html(page(f"Diff {d.left} → {d.right} · eventstore explorer", diff_body(d, a, b)))

    def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name == "report.css":
            return Response(REPORT_CSS, media_type="text/css; charset=utf-8")
        if name not in _STATIC:
            raise HTTPException(404, "no such file")
        data = resources.files("eventstore.explorer").joinpath("static", name).read_bytes()
        return Response(data, media_type=_STATIC[name], headers={"Cache-Control": "no-cache"})

    async def on_store_error(request: Request, exc: Exception) -> Response:
        status = 404 if isinstance(exc, (SessionNotFound, SessionErased, VersionNotFound)) else 400
        return _error_page(status, str(exc))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        return _error_page(status, str(getattr(exc, "detail", "")) or "error")

    async def on_crash(request: Request, exc: Exception) -> Response:
        return _error_page(500, "the explorer failed to render this page (see the server's log)")

    middleware = [Middleware(_Headers)]
    if allowed_hosts is not None:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)))
    return Starlette(
        routes=[
            Route("/", catalogue),
            Route("/diff", diff),
            Route("/static/{name}", static),
            Route("/sessions/{rest:path}", sessions_route),
        ],
        middleware=middleware,
        exception_handlers={
            EventStoreError: on_store_error,
            HTTPException: on_http_error,
            Exception: on_crash,
        },
    )


def _follow(store: EventStore, session: str, after: int) -> Follower:
    return store.follow(session, after=after, idle_timeout=_IDLE)


def _next(follower: Follower) -> RecordedEvent | None:
    return next(follower, None)


def _sse(ev: RecordedEvent) -> bytes:
    doc = json.dumps({"version": ev.version, "type": ev.type, "turn": ev.turn})
    return f"id: {ev.version}\ndata: {doc}\n\n".encode()
