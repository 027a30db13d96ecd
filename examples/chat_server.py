"""A chat server on AsyncEventStore that serves the Vercel AI SDK's ``useChat``.

Run it (after ``pip install -e '.[examples]'``), then open http://localhost:8000/::

    EVENTSTORE_URL=sqlite:///chat.db uvicorn examples.chat_server:app --port 8000

The AI SDK routes (what ``DefaultChatTransport`` and the page at ``/`` use):

- ``POST /api/chat`` takes the body ``DefaultChatTransport`` sends (``id`` = the session,
  ``messages``, ``trigger``, ``messageId``). ``submit-message`` stores the user's last
  message under the client's id (a ``send`` opening a streaming turn, ``store.turn``) before
  the response starts; when ``messageId`` names an earlier user message (the user edited
  it), the session is first rewound to just before that message (the old line stays
  readable under the id ``store.rewind`` returns). ``regenerate-message`` records a
  ``retry``. The reply is the UI message stream (``eventstore.integrations.ai_sdk``).
- ``POST /api/chat/{id}/stop`` records a ``stop``: the reply ends, its open calls are
  cancelled (the page's stop button calls it along with aborting its request).
- ``GET /api/chat/{id}/stream`` resumes: ``204`` when no turn is open, else the open turn
  replayed from the log, then live. ``GET /api/chat/{id}/messages`` is the session as UI
  messages (what a client that streamed every turn holds), for a page that reloads.

The model (a stand-in: it echoes the user's words, paced by ``CHAT_WORD_DELAY`` seconds per
word; a message that mentions "weather" makes it call a ``get_weather`` tool first, one
that mentions "fail" makes it fail with a ``network`` error) runs in a background task
that writes into the turn. A response does not stream what the model writes: it *follows
the log* from the turn's first event, so it carries exactly what was stored (also when a
stop from elsewhere drops parts the model had written), a resumed stream is the same code,
and a client that disconnects only stops following: the reply goes on to its end, and a
reload picks it up.

The routes of the plain JSON API stay: ``POST /sessions/{id}/messages`` (``{"text": ...}``;
the reply as newline-delimited JSON parts, each appended with ``expected_version``), ``GET
/sessions/{id}`` (the state; ``?version=N``), ``GET /sessions/{id}/history`` (the events)
and ``GET /sessions/{id}/events`` (the events as Server-Sent Events, live; ``id:`` is the
version, so a reconnecting ``EventSource`` resumes after ``Last-Event-ID``).

Settings (environment): ``EVENTSTORE_URL`` (default ``sqlite:///chat.db``),
``CHAT_AI_SDK_PROTOCOL`` (the major version of the client's ``ai`` package, default 5),
``CHAT_WORD_DELAY`` (default 0.01), ``CHAT_MAX_BODY`` (bytes, default 1 MiB: a larger body
is refused with 413 without being read whole), ``CHAT_BODY_TIMEOUT`` (seconds to receive a
whole body, default 10: else 408). A body must be ``application/json`` (else 415).

Authentication: there is none. Anyone who can reach the server can read, write, stop and
rewind every session, because the session id in the URL is the only key. In production put
it behind your authentication (a session cookie or a bearer token checked in a middleware),
derive the session ids a user may touch from who they are (``store.set_info(owner=...)``
and check the owner on every route), pass the user as ``actor`` so the log says who did
what, rate-limit ``POST /api/chat``, and serve it over TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from eventstore import (
    AsyncEventStore,
    ConcurrencyError,
    EventStoreError,
    InvalidEvent,
    SessionNotFound,
    SessionState,
    TurnBusy,
    TurnStopped,
)
from eventstore.integrations.ai_sdk import (
    UI_MESSAGE_STREAM_HEADERS,
    UIMessageStreamEncoder,
    sse,
    to_ui_messages,
)

log = logging.getLogger("chat_server")

#: Seconds between two streamed words of the stand-in model.
WORD_DELAY = float(os.environ.get("CHAT_WORD_DELAY", "0.01"))
#: The major version of the client's ``ai`` package: which chunk types it understands.
PROTOCOL = int(os.environ.get("CHAT_AI_SDK_PROTOCOL", "5"))
#: The largest request body accepted, in bytes.
MAX_BODY = int(os.environ.get("CHAT_MAX_BODY", str(1 << 20)))
#: Seconds a client may take to send a whole request body.
BODY_TIMEOUT = float(os.environ.get("CHAT_BODY_TIMEOUT", "10"))
#: Seconds without a new event after which a follower of an open turn gives up.
FOLLOW_IDLE = 60.0
#: A turn no process has written to for this long is closed when a client resumes it.
STALE_AFTER = 30.0
#: The longest session or message id accepted.
MAX_ID = 200

PAGE = Path(__file__).with_name("chat_page.html")


def store_of(request: Request) -> AsyncEventStore:
    """The application's store (opened by the lifespan)."""
    store: AsyncEventStore = request.app.state.store
    return store


def error(status: int, exc: EventStoreError | str, kind: str | None = None) -> JSONResponse:
    """An error response naming the error's type."""
    if isinstance(exc, str):
        return JSONResponse({"error": kind or "BadRequest", "message": exc}, status_code=status)
    return JSONResponse({"error": type(exc).__name__, "message": str(exc)}, status_code=status)


class BodyError(Exception):
    """A request body refused before it was parsed (its status and message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_json(request: Request) -> Any:
    """The request's JSON body, read with a size limit and a deadline.

    Raises:
        BodyError: not ``application/json`` (415), larger than ``MAX_BODY`` (413, as soon as
            the header or the bytes received say so), slower than ``BODY_TIMEOUT`` (408),
            or not JSON (400).
    """
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise BodyError(415, "send the body as application/json")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY):
        raise BodyError(413, f"the body is larger than {MAX_BODY} bytes")

    async def receive() -> bytes:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                raise BodyError(413, f"the body is larger than {MAX_BODY} bytes")
        return bytes(body)

    try:
        raw = await asyncio.wait_for(receive(), BODY_TIMEOUT)
    except TimeoutError:
        raise BodyError(408, f"the body did not arrive within {BODY_TIMEOUT:g} s") from None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BodyError(400, "the body is not JSON") from None


# --------------------------------------------------------------------------- the stand-in model


def _words(text: str) -> Iterator[str]:
    for i, word in enumerate(text.split(" ")):
        yield word if i == 0 else " " + word


async def stand_in_model(text: str, *, retry: bool = False) -> AsyncIterator[dict[str, Any]]:
    """A stand-in for a model's stream of parts: the user's words echoed back, one by one.

    "weather" in the text makes it call a ``get_weather`` tool (and answer in a second
    message); "fail" makes it fail midway with a ``network`` error, unless it is a retry.
    """
    message_id = f"a-{uuid.uuid4().hex[:12]}"
    yield {"type": "message-start", "messageId": message_id}
    if "weather" in text.lower():
        for word in _words("Let me check the weather."):
            await asyncio.sleep(WORD_DELAY)
            yield {"type": "text-delta", "messageId": message_id, "text": word}
        call_id = f"call-{uuid.uuid4().hex[:12]}"
        yield {"type": "tool-call", "messageId": message_id, "id": call_id, "name": "get_weather",
               "input": {"question": text}}
        await asyncio.sleep(WORD_DELAY * 5)
        yield {"type": "tool-result", "id": call_id, "output": {"forecast": "sunny", "celsius": 21}}
        message_id = f"a-{uuid.uuid4().hex[:12]}"
        yield {"type": "message-start", "messageId": message_id}
    for i, word in enumerate(_words(f"You said: {text}")):
        if i == 3 and "fail" in text.lower() and not retry:
            yield {"type": "error", "error": "The stand-in model lost its connection.", "code": "network"}
            return
        await asyncio.sleep(WORD_DELAY)
        yield {"type": "text-delta", "messageId": message_id, "text": word}
    yield {"type": "finish", "reason": "stop"}


async def run_reply(stack: contextlib.AsyncExitStack, turn: Any, text: str, retry: bool) -> None:
    """The model's reply, written into the open turn; the turn is closed at the end.

    Leaving ``stack`` with an exception (a crash, the server shutting down) records the
    interruption, so no call stays open.
    """
    async with stack:
        try:
            async for part in stand_in_model(text, retry=retry):
                await turn.write(part)
        except TurnStopped:
            pass  # a stop reached the session: nothing more of this reply is stored


def start_reply(
    request: Request, session: str, stack: contextlib.AsyncExitStack, turn: Any, text: str, retry: bool
) -> None:
    """Run the reply in the background: it outlives the request that started it."""
    replies: dict[str, asyncio.Task[None]] = request.app.state.replies
    task = asyncio.create_task(run_reply(stack, turn, text, retry), name=f"reply:{session}")
    replies[session] = task

    def done(t: asyncio.Task[None]) -> None:
        if replies.get(session) is t:
            del replies[session]
        if not t.cancelled() and t.exception() is not None:
            log.error("the reply of session %r failed: %r", session, t.exception())

    task.add_done_callback(done)


# --------------------------------------------------------------------------- the AI SDK routes


def _text_of(message: Any) -> str | None:
    """The text of a UI message from the client, or ``None`` when it is not a user message."""
    if not isinstance(message, dict) or message.get("role") != "user" or not isinstance(message.get("parts"), list):
        return None
    texts = [p["text"] for p in message["parts"] if isinstance(p, dict) and p.get("type") == "text"
             and isinstance(p.get("text"), str)]
    return "".join(texts)


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_ID


async def _load(store: AsyncEventStore, session: str) -> SessionState | None:
    try:
        return await store.load(session)
    except SessionNotFound:
        return None


async def _send_version(store: AsyncEventStore, session: str, message_id: str) -> int | None:
    """The version of the newest ``send`` of the user message ``message_id``."""
    found = None
    async for ev in store.history(session):
        if ev.type == "send" and ev.action.get("id") == message_id:
            found = ev.version
    return found


def follow_turn(request: Request, session: str, opened_at: int, before: Any) -> StreamingResponse:
    """The UI message stream of the turn opened at version ``opened_at``: replayed from the
    log, then live, until the turn ends (or the client goes away)."""
    store = store_of(request)
    encoder = UIMessageStreamEncoder(before, protocol=PROTOCOL)

    async def stream() -> AsyncIterator[bytes]:
        follower = store.follow(session, after=opened_at - 1, idle_timeout=FOLLOW_IDLE)
        try:
            async for ev in follower:
                chunks = encoder.feed(ev.action)
                if chunks:
                    yield b"".join(sse(chunks, done=False))
                if encoder.ended:
                    break
        except EventStoreError as exc:  # e.g. the session was rewound meanwhile
            yield b"".join(sse([{"type": "error", "errorText": str(exc)}], done=False))
        except (ClientDisconnect, OSError):
            return  # the client went away; the reply goes on in the background
        finally:
            await follower.aclose()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(stream(), headers=UI_MESSAGE_STREAM_HEADERS)


async def post_chat(request: Request) -> Response:
    """Store the user's message (or a retry, or an edit), then stream the reply."""
    store = store_of(request)
    try:
        body = await read_json(request)
    except BodyError as exc:
        return error(exc.status, str(exc))
    if not isinstance(body, dict) or not _valid_id(body.get("id")) or not isinstance(body.get("messages"), list):
        return error(400, "send the body DefaultChatTransport sends: id, messages, trigger, messageId")
    session: str = body["id"]
    trigger = body.get("trigger", "submit-message")
    target = body.get("messageId")
    if trigger not in ("submit-message", "regenerate-message") or (target is not None and not _valid_id(target)):
        return error(400, "trigger is submit-message or regenerate-message; messageId a message id")
    state = await _load(store, session)
    running = request.app.state.replies.get(session)
    if running is not None:
        if state is not None and state.to_json()["status"] == "streaming":
            return error(409, "a reply is still streaming in this session: stop it first", "TurnBusy")
        # Its last event is stored (a client may ask again at once): the task is closing the turn.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(running), 10)
    if trigger == "regenerate-message":
        users = [m for m in (state.to_json()["messages"] if state else []) if m["role"] == "user"]
        if not users:
            return error(400, "there is no user message to regenerate the reply to")
        opening: dict[str, Any] = {"type": "retry"}
        text = "".join(p["text"] for p in users[-1]["parts"] if p["type"] == "text")
    else:
        last: Any = body["messages"][-1] if body["messages"] else None
        text_or_none = _text_of(last)
        if text_or_none is None or not _valid_id(last.get("id")):
            return error(400, "the last message must be the user's, with an id and text parts")
        text = text_or_none
        message_id: str = last["id"]
        edited = target if target is not None else message_id
        if state is not None and any(m["id"] == edited and m["role"] == "user" for m in state.to_json()["messages"]):
            # An edit: the session goes back to just before that message; the old line is kept.
            rewind = getattr(store, "rewind", None)
            if rewind is None:
                return error(501, "this eventstore cannot rewind a session", "NotImplemented")
            version = await _send_version(store, session, edited)
            if version is not None:
                try:
                    await rewind(session, to=version - 1, actor="chat-server", reason="edit")
                except EventStoreError as exc:
                    return error(409, exc)
        opening = {"type": "send", "id": message_id, "text": text}
    stack = contextlib.AsyncExitStack()
    try:
        # Durable before the response starts: a crash mid-reply never loses the message.
        turn = await stack.enter_async_context(store.turn(session, opening, actor="chat-server"))
    except TurnBusy as exc:
        return error(409, exc)
    except InvalidEvent as exc:
        return error(400, exc)
    except EventStoreError as exc:
        return error(503, exc)
    try:
        before = await store.load(session, version=turn.opened_at - 1)
    except BaseException:
        await stack.aclose()
        raise
    start_reply(request, session, stack, turn, text, opening["type"] == "retry")
    return follow_turn(request, session, turn.opened_at, before)


async def post_stop(request: Request) -> Response:
    """Record a stop: the open reply ends, its open calls are cancelled."""
    store = store_of(request)
    session = request.path_params["session"]
    state = await _load(store, session)
    if state is None:
        return error(404, SessionNotFound(session))
    if state.to_json()["status"] != "streaming":
        return Response(status_code=204)
    try:
        await store.append(session, [{"type": "stop"}], actor="chat-server")
    except EventStoreError as exc:
        return error(409, exc)
    return Response(status_code=204)


async def _open_turn(store: AsyncEventStore, session: str) -> int | None:
    """The version of the ``send`` or ``retry`` that opened the session's open turn."""
    opened = None
    async for ev in store.history(session):
        if ev.type in ("send", "retry"):
            opened = ev.version
    return opened


async def get_stream(request: Request) -> Response:
    """Resume: the open turn replayed from the log, then live; 204 when none is open."""
    store = store_of(request)
    session = request.path_params["session"]
    state = await _load(store, session)
    if state is None or state.to_json()["status"] != "streaming":
        return Response(status_code=204)
    if session not in request.app.state.replies:
        # No reply of this server writes it: close it when no process has for a while.
        with contextlib.suppress(EventStoreError):
            if await store.recover(session, stale_after=STALE_AFTER) is not None:
                return Response(status_code=204)
    opened = await _open_turn(store, session)
    if opened is None:
        return Response(status_code=204)
    before = await store.load(session, version=opened - 1)
    return follow_turn(request, session, opened, before)


async def get_messages(request: Request) -> Response:
    """The session as UI messages: what a client that streamed every turn holds.

    While a turn is open its reply is left out: ``GET /api/chat/{id}/stream`` replays it
    from its first chunk, as the client that resumes expects.
    """
    state = await _load(store_of(request), request.path_params["session"])
    messages = to_ui_messages(state, protocol=PROTOCOL) if state is not None else []
    status = state.to_json()["status"] if state is not None else "idle"
    if status == "streaming" and messages and messages[-1]["role"] == "assistant":
        messages.pop()
    return Response(orjson.dumps({"messages": messages, "status": status}), media_type="application/json")


async def get_page(request: Request) -> Response:
    """The chat page (plain HTML and JS; it loads nothing from elsewhere)."""
    headers = {"content-security-policy": "default-src 'self'; script-src 'unsafe-inline'; "
               "style-src 'unsafe-inline'; connect-src 'self'; img-src 'none'"}
    return HTMLResponse(PAGE.read_text(encoding="utf-8"), headers=headers)


# --------------------------------------------------------------------------- the plain JSON API


async def post_message(request: Request) -> Response:
    """Append the user's message, then stream and record the assistant's reply."""
    store = store_of(request)
    session = request.path_params["session"]
    try:
        body: Any = await read_json(request)
    except BodyError as exc:
        if exc.status != 400:
            return error(exc.status, str(exc))
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("text"), str):
        return JSONResponse({"error": "InvalidEvent", "message": 'send {"text": "..."}'}, status_code=400)
    send = {"type": "send", "id": str(body.get("id") or f"u-{uuid.uuid4().hex[:12]}"), "text": body["text"]}
    try:
        # Durable before the first byte of the reply leaves the server.
        sent = await store.append(session, [send], actor="user")
    except InvalidEvent as exc:
        return error(400, exc)
    except EventStoreError as exc:
        return error(503, exc)

    async def reply() -> AsyncIterator[bytes]:
        version = sent.version
        try:
            async for part in _echo(body["text"]):
                r = await store.append(session, [{"type": "part", "part": part}],
                                       expected_version=version, actor="model:echo")
                version = r.version
                yield orjson.dumps(part) + b"\n"
        except ConcurrencyError:
            # Someone else wrote to the session meanwhile (a stop, another reply): end here.
            yield orjson.dumps({"type": "error", "error": "the session moved on"}) + b"\n"

    headers = {"x-session-version": str(sent.version)}
    return StreamingResponse(reply(), media_type="application/x-ndjson", headers=headers)


async def _echo(text: str) -> AsyncIterator[dict[str, Any]]:
    message_id = f"a-{uuid.uuid4().hex[:12]}"
    yield {"type": "message-start", "messageId": message_id}
    for word in _words(f"You said: {text}"):
        await asyncio.sleep(WORD_DELAY)
        yield {"type": "text-delta", "messageId": message_id, "text": word}
    yield {"type": "finish", "reason": "stop"}


async def get_state(request: Request) -> Response:
    """The session's state at its head, or at ``?version=N``."""
    raw = request.query_params.get("version")
    try:
        version = int(raw) if raw is not None else None
        state = await store_of(request).load(request.path_params["session"], version=version)
    except ValueError:
        return JSONResponse({"error": "InvalidEvent", "message": "version must be an integer"}, status_code=400)
    except SessionNotFound as exc:
        return error(404, exc)
    except EventStoreError as exc:
        return error(400, exc)
    return Response(orjson.dumps(state.to_json()), media_type="application/json")


async def get_history(request: Request) -> Response:
    """The session's events, oldest first."""
    store = store_of(request)
    try:
        events = [e.to_json() async for e in store.history(request.path_params["session"])]
    except SessionNotFound as exc:
        return error(404, exc)
    except EventStoreError as exc:
        return error(400, exc)
    return Response(orjson.dumps(events), media_type="application/json")


def _resume_after(request: Request) -> int | None:
    """The version to resume after: ``Last-Event-ID`` (a reconnecting ``EventSource``), else
    ``?after=``, else 0; ``None`` when it is not a version number."""
    raw = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 10 else None


async def get_events(request: Request) -> Response:
    """The session's events as Server-Sent Events (``id:`` = version), live."""
    store = store_of(request)
    session = request.path_params["session"]
    after = _resume_after(request)
    if after is None:
        return JSONResponse({"error": "InvalidEvent", "message": "Last-Event-ID must be a version"}, status_code=400)
    try:
        await store.head(session)  # a missing session is a 404, not an empty stream
    except SessionNotFound as exc:
        return error(404, exc)
    except EventStoreError as exc:
        return error(400, exc)
    follower = store.follow(session, after=after, idle_timeout=None)

    async def stream() -> AsyncIterator[bytes]:
        try:
            async for ev in follower:
                data = orjson.dumps(ev.to_json()).decode()
                yield f"id: {ev.version}\nevent: {ev.type}\ndata: {data}\n\n".encode()
        except EventStoreError as exc:  # e.g. `after` beyond the head
            yield f"event: error\ndata: {orjson.dumps(str(exc)).decode()}\n\n".encode()
        except (ClientDisconnect, OSError):
            return
        finally:
            # Also when the client goes away (the response task is cancelled).
            await follower.aclose()

    headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}
    return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    """Open (and migrate) the store for the server's lifetime; on shutdown, interrupt the
    replies still running (each records the interruption) and release the store."""
    async with AsyncEventStore(os.environ.get("EVENTSTORE_URL", "sqlite:///chat.db")) as store:
        await store.migrate()
        app.state.store = store
        app.state.replies = {}
        try:
            yield
        finally:
            tasks = list(app.state.replies.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


app = Starlette(
    routes=[
        Route("/", get_page, methods=["GET"]),
        Route("/api/chat", post_chat, methods=["POST"]),
        Route("/api/chat/{session}/stop", post_stop, methods=["POST"]),
        Route("/api/chat/{session}/stream", get_stream, methods=["GET"]),
        Route("/api/chat/{session}/messages", get_messages, methods=["GET"]),
        Route("/sessions/{session}/messages", post_message, methods=["POST"]),
        Route("/sessions/{session}", get_state, methods=["GET"]),
        Route("/sessions/{session}/history", get_history, methods=["GET"]),
        Route("/sessions/{session}/events", get_events, methods=["GET"]),
    ],
    lifespan=lifespan,
)
