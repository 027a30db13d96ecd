"""A chat server on AsyncEventStore: persist the user's message, stream the reply, record it.

Run it (after ``pip install -e '.[examples]'``)::

    EVENTSTORE_URL=sqlite:///chat.db uvicorn examples.chat_server:app --port 8000

    curl -N -X POST localhost:8000/sessions/s1/messages -d '{"text": "Hello"}'
    curl localhost:8000/sessions/s1            # the session's state
    curl localhost:8000/sessions/s1/history    # its events, oldest first

``POST /sessions/{id}/messages`` appends the user's ``send`` and only then starts the
response, so a crash mid-reply never loses what the user wrote. The reply (a stand-in for
a model: it echoes the text word by word) is streamed as newline-delimited JSON parts,
and every part is appended as it is sent, with ``expected_version`` so two replies can
never interleave in one session. ``GET /sessions/{id}`` serves the state (the fold of
the log) and ``GET /sessions/{id}/history`` the events.

Every request is served by one ``AsyncEventStore`` on the server's event loop: no thread
pool, and the loop stays free while the database works.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from eventstore import (
    AsyncEventStore,
    ConcurrencyError,
    EventStoreError,
    InvalidEvent,
    SessionNotFound,
)

#: Seconds between two streamed words of the stand-in model.
WORD_DELAY = float(os.environ.get("CHAT_WORD_DELAY", "0.01"))


def store_of(request: Request) -> AsyncEventStore:
    """The application's store (opened by the lifespan)."""
    store: AsyncEventStore = request.app.state.store
    return store


async def fake_model(text: str) -> AsyncIterator[str]:
    """A stand-in for a model's token stream: the user's words echoed back, one by one."""
    for i, word in enumerate(f"You said: {text}".split(" ")):
        await asyncio.sleep(WORD_DELAY)
        yield word if i == 0 else " " + word


def error(status: int, exc: EventStoreError) -> JSONResponse:
    """An error response naming the error's type."""
    return JSONResponse({"error": type(exc).__name__, "message": str(exc)}, status_code=status)


async def post_message(request: Request) -> Response:
    """Append the user's message, then stream and record the assistant's reply."""
    store = store_of(request)
    session = request.path_params["session"]
    try:
        body: Any = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
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
        message_id = f"a-{uuid.uuid4().hex[:12]}"
        version = sent.version
        parts: AsyncIterator[dict[str, Any]] = _parts(message_id, body["text"])
        try:
            async for part in parts:
                r = await store.append(session, [{"type": "part", "part": part}],
                                       expected_version=version, actor="model:echo")
                version = r.version
                yield orjson.dumps(part) + b"\n"
        except ConcurrencyError:
            # Someone else wrote to the session meanwhile (a stop, another reply): end here.
            yield orjson.dumps({"type": "error", "error": "the session moved on"}) + b"\n"

    headers = {"x-session-version": str(sent.version)}
    return StreamingResponse(reply(), media_type="application/x-ndjson", headers=headers)


async def _parts(message_id: str, text: str) -> AsyncIterator[dict[str, Any]]:
    yield {"type": "message-start", "messageId": message_id}
    async for token in fake_model(text):
        yield {"type": "text-delta", "messageId": message_id, "text": token}
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


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    """Open (and migrate) the store for the server's lifetime; release it on shutdown."""
    async with AsyncEventStore(os.environ.get("EVENTSTORE_URL", "sqlite:///chat.db")) as store:
        await store.migrate()
        app.state.store = store
        yield


app = Starlette(
    routes=[
        Route("/sessions/{session}/messages", post_message, methods=["POST"]),
        Route("/sessions/{session}", get_state, methods=["GET"]),
        Route("/sessions/{session}/history", get_history, methods=["GET"]),
    ],
    lifespan=lifespan,
)
