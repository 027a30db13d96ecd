"""A session of the OpenAI Agents SDK (``openai-agents``) kept in an eventstore session.

::

    from agents import Agent, Runner
    from eventstore.integrations.openai_agents import EventStoreSession

    session = EventStoreSession("s1", "sqlite:///chat.db")
    result = await Runner.run(agent, "hi", session=session)

:class:`EventStoreSession` implements the SDK's ``Session`` protocol (``get_items``,
``add_items``, ``pop_item``, ``clear_session``) on an :class:`~eventstore.EventStore`, an
:class:`~eventstore.AsyncEventStore` or a database URL. Each item is stored twice over, in
one event:

- its exact JSON as the event's provider-native data, so ``get_items`` returns exactly the
  items added (ids, content lists, roles, reasoning and its encrypted content);
- folded into the session as ordinary actions (a user message is a ``send``, assistant
  text a text part, reasoning a ``reasoning`` part, a ``function_call`` a ``tool-call``, its
  output a ``tool-result``), so ``history``, ``diff``, the report and ``verify`` show the run.

Every event the session writes carries the metadata :data:`SOURCE`; an item is an event
with that metadata and native data. ``pop_item`` and ``clear_session`` rewind the session
(the removed items stay readable in the kept line the rewind returns).

The SDK is imported only when a session is created: importing :mod:`eventstore` never
imports it. The mapping is described in ``docs/openai-agents.md``.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from eventstore import AsyncEventStore, EventStore, InvalidEvent, SessionNotFound

__all__ = ["EventStoreSession", "SOURCE", "item_actions"]

#: The metadata of every event an :class:`EventStoreSession` writes.
SOURCE: dict[str, Any] = {"source": "openai-agents"}

Item = dict[str, Any]
Action = dict[str, Any]


def _text_of(content: Any, kinds: tuple[str, ...]) -> str:
    """The text of a message's content: a string, or the ``text`` (or ``refusal``) of
    its parts of the given types, joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    out = []
    for part in content:
        if isinstance(part, Mapping) and part.get("type") in kinds:
            text = part.get("text", part.get("refusal"))
            if isinstance(text, str):
                out.append(text)
    return "".join(out)


def _json_value(raw: Any) -> Any:
    """A function call's arguments (JSON text) as a value; text that is not JSON stays text."""
    if not isinstance(raw, str):
        return raw
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def item_actions(
    items: Iterable[Mapping[str, Any]], open_message: str | None = None
) -> tuple[list[Action], list[bytes | None]]:
    """The actions one ``add_items`` call appends, and each action's native data.

    Each item gets at least one action; the first carries the item's exact JSON as its
    native data, and the others (a ``message-start`` the item needed, the ``finish`` that
    ends the reply) carry none. An item with no place in the fold (a system message, a
    hosted tool call, ...) is a ``step-finish`` part, which changes nothing.

    Args:
        items: the SDK's items, as given to ``add_items``.
        open_message: the id of the assistant message the session's reply is still
            streaming into (the SDK adds a run's items step by step), or ``None``.

    A reply ends (``finish``: the session is idle) with a batch whose last item is an
    assistant message: the run's final output.

    Raises:
        InvalidEvent: an item is not a JSON object.
    """
    actions: list[Action] = []
    natives: list[bytes | None] = []
    message = open_message  # the assistant message this batch's parts go to

    def add(action: Action, native: bytes | None) -> None:
        actions.append(action)
        natives.append(native)

    def assistant(native: bytes | None) -> tuple[str, bytes | None]:
        # Opens the reply's message when none is open; the item's native data goes on
        # the first action it produces, whichever that is. The ids are the store's own:
        # a provider's item ids repeat (and live on in the native data anyway).
        nonlocal message
        if message is None:
            message = _new_id("a")
            add({"type": "part", "part": {"type": "message-start", "messageId": message}}, native)
            return message, None
        return message, native

    for item in items:
        if not isinstance(item, Mapping):
            raise InvalidEvent(f"an item must be a JSON object, got {type(item).__name__}", field="items")
        try:
            native: bytes | None = orjson.dumps(dict(item))
        except (orjson.JSONEncodeError, TypeError) as exc:
            raise InvalidEvent(f"an item is not representable as JSON: {exc}", field="items") from None
        kind = item.get("type", "message" if "role" in item else None)
        role = item.get("role")
        if kind == "message" and role == "user":
            add({"type": "send", "id": _new_id("u"), "text": _text_of(item.get("content"), ("input_text", "output_text", "text"))}, native)
            message = None  # a later reply starts a message of its own
        elif kind == "message" and role == "assistant":
            mid, native = assistant(native)
            text = _text_of(item.get("content"), ("output_text", "refusal", "input_text", "text"))
            add({"type": "part", "part": {"type": "text-delta", "messageId": mid, "text": text}}, native)
        elif kind == "reasoning":
            mid, native = assistant(native)
            summary = item.get("summary")
            text = _text_of(summary, ("summary_text",)) if isinstance(summary, list) else ""
            if not text:
                text = _text_of(item.get("content"), ("reasoning_text",))
            add({"type": "part", "part": {"type": "reasoning", "messageId": mid, "text": text}}, native)
        elif kind == "function_call" and isinstance(item.get("call_id"), str):
            mid, native = assistant(native)
            add(
                {
                    "type": "part",
                    "part": {
                        "type": "tool-call",
                        "messageId": mid,
                        "id": item["call_id"],
                        "name": str(item.get("name", "")),
                        "input": _json_value(item.get("arguments")),
                    },
                },
                native,
            )
        elif kind == "function_call_output" and isinstance(item.get("call_id"), str):
            output = item.get("output")
            add({"type": "part", "part": {"type": "tool-result", "id": item["call_id"], "output": output}}, native)
        else:
            add({"type": "part", "part": {"type": "step-finish"}}, native)
    if message is not None and kind == "message" and role == "assistant":
        # The reply ends with its text: the session is idle again.
        add({"type": "part", "part": {"type": "finish"}}, None)
    return actions, natives


class _Sync:
    """An :class:`~eventstore.EventStore` driven from the event loop through a thread."""

    def __init__(self, store: Any) -> None:
        self.store = store

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.store, name)
        if name == "history":
            return await asyncio.to_thread(lambda: list(method(*args, **kwargs)))
        return await asyncio.to_thread(method, *args, **kwargs)


class _Async:
    """An :class:`~eventstore.AsyncEventStore`, awaited on the caller's loop."""

    def __init__(self, store: Any) -> None:
        self.store = store

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.store, name)
        if name == "history":
            return [e async for e in method(*args, **kwargs)]
        return await method(*args, **kwargs)


async def _settled(coro: Any) -> Any:
    """Run a write to its end even when the caller is cancelled meanwhile, then re-raise
    the cancellation: a caller never leaves not knowing whether the write happened."""
    task = asyncio.ensure_future(coro)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    result = task.result()
    if cancelled is not None:
        raise cancelled
    return result


class EventStoreSession:
    """The OpenAI Agents SDK's ``Session`` protocol on an eventstore session.

    Args:
        session_id: the eventstore session that holds the conversation.
        store: an :class:`~eventstore.EventStore`, an :class:`~eventstore.AsyncEventStore`
            or a database URL (then the session opens, migrates and closes its own store).
        session_settings: the SDK's ``SessionSettings`` (or a dict of them); ``limit`` is
            the default of :meth:`get_items`.
        actor: recorded as the actor of every event the session writes.

    An ``EventStore`` (or a URL) is used from worker threads, so the session works on any
    event loop, ``Runner.run_sync``'s included; an ``AsyncEventStore`` is awaited on the
    loop that calls the session.
    """

    def __init__(
        self,
        session_id: str,
        store: Any,
        session_settings: Any = None,
        *,
        actor: str | None = None,
    ) -> None:
        from agents.memory.session_settings import SessionSettings, coerce_session_settings

        self.session_id = session_id
        self.session_settings = (
            coerce_session_settings(session_settings) if session_settings is not None else SessionSettings()
        )
        self.actor = actor
        self._owned: EventStore | None = None
        self._migrated = threading.Event()
        self._migrate_lock = threading.Lock()
        if isinstance(store, str):
            self._owned = EventStore(store)
            self._store: _Sync | _Async = _Sync(self._owned)
        elif isinstance(store, AsyncEventStore):
            self._store = _Async(store)
            self._migrated.set()
        elif isinstance(store, EventStore):
            self._store = _Sync(store)
            self._migrated.set()
        else:
            raise InvalidEvent(
                "store must be an EventStore, an AsyncEventStore or a database URL", field="store"
            )
        self._closed = False

    # -- the Session protocol -----------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The items added, oldest first (``limit``: only the newest ``limit``, or the
        session settings' ``limit`` when ``None``; 0 gives none, a negative limit all).

        Returns:
            Exactly the items given to :meth:`add_items` (equal JSON), in order.
        """
        from agents.memory.session_settings import resolve_session_limit

        wanted = resolve_session_limit(limit, self.session_settings)
        if wanted == 0:
            return []
        _, events = await self._item_events()
        items = [orjson.loads(e.native_bytes) for e in events]
        return items if wanted is None or wanted < 0 else items[-wanted:]

    async def add_items(self, items: list[Any]) -> None:
        """Append the items to the session, in one atomic append.

        Raises:
            InvalidEvent: an item is not a JSON object (nothing is written).
            EventStoreError: the store refused the append.
        """
        self._check_open()
        if not items:
            return
        await self._ready()
        actions, natives = item_actions(items, await self._open_message(items[0]))
        await _settled(
            self._store.call(
                "append", self.session_id, actions, native=natives, actor=self.actor, metadata=SOURCE
            )
        )

    async def pop_item(self) -> Any | None:
        """Remove and return the newest item (``None`` when there is none).

        The session is rewound to just before the item's first event; the events from
        there on stay readable under the kept line the rewind returns.
        """
        self._check_open()
        return await _settled(self._pop())

    async def clear_session(self) -> None:
        """Remove every item: the session is rewound to version 0 (the old line is kept)."""
        self._check_open()
        await _settled(self._clear())

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Release the store this session opened from a URL (a store passed in is the
        caller's to close). The session must not be used afterwards."""
        self._closed = True
        if self._owned is not None:
            self._owned.close()

    # -- internals ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")

    async def _ready(self) -> None:
        if self._migrated.is_set():
            return

        def migrate() -> None:
            with self._migrate_lock:
                if not self._migrated.is_set():
                    assert self._owned is not None
                    self._owned.migrate()
                    self._migrated.set()

        await asyncio.to_thread(migrate)

    async def _open_message(self, first: Any) -> str | None:
        """The assistant message a batch that does not start with a user message goes on
        with: the session's last message, while its reply is streaming."""
        if isinstance(first, Mapping) and first.get("role") == "user":
            return None
        try:
            state = await self._store.call("load", self.session_id)
        except SessionNotFound:
            return None
        doc = state.to_json()
        messages = doc.get("messages") or []
        if doc.get("status") != "streaming" or not messages or messages[-1].get("role") != "assistant":
            return None
        return str(messages[-1]["id"])

    async def _item_events(self) -> tuple[int, list[Any]]:
        """The head the history was read at, and the session's events that hold an item,
        oldest first (``(0, [])`` for a new session)."""
        self._check_open()
        await self._ready()
        try:
            events = await self._store.call("history", self.session_id)
        except SessionNotFound:
            return 0, []
        head = events[-1].version if events else 0
        return head, [e for e in events if e.native_bytes is not None and e.metadata == SOURCE]

    async def _pop(self) -> Any | None:
        head, events = await self._item_events()
        if not events:
            return None
        last = events[-1]
        # expected_version: an item added since the read is never taken away with it.
        await self._store.call(
            "rewind", self.session_id, to=last.version - 1, expected_version=head, actor=self.actor, reason="pop_item"
        )
        return orjson.loads(last.native_bytes)

    async def _clear(self) -> None:
        await self._ready()
        try:
            head = await self._store.call("head", self.session_id)
        except SessionNotFound:
            return
        if head:
            await self._store.call(
                "rewind", self.session_id, to=0, expected_version=head, actor=self.actor, reason="clear_session"
            )
