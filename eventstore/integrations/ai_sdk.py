"""The Vercel AI SDK's UI message stream (what ``useChat`` reads), from eventstore actions.

A chat server that records a turn with ``store.turn`` feeds the same actions to a
:class:`UIMessageStreamEncoder` and sends the chunks it returns as Server-Sent Events
(:func:`sse`, :data:`UI_MESSAGE_STREAM_HEADERS`). Because the encoder is a fold of the
actions, a live stream, a stream resumed from the log and a replay give the same chunks;
:func:`to_ui_messages` gives the messages a client that streamed every turn holds, so a
reloaded page shows what it showed live. ``protocol`` is the major version of the client's
``ai`` package: 5 gets only ai@5's chunk types, 6 and later also the approval chunks of a
call awaiting confirmation. The mapping, and what has no equivalent, is in
``docs/ai-sdk.md``.

Nothing here does I/O; the module needs no Python package beyond eventstore.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import orjson

from eventstore import InvalidEvent, SessionState, apply_action

__all__ = [
    "UI_MESSAGE_STREAM_HEADERS",
    "UIMessageStreamEncoder",
    "session_ui_messages",
    "sse",
    "to_ui_messages",
    "turns_of",
]

#: The response headers of a UI message stream (the client checks the last one).
UI_MESSAGE_STREAM_HEADERS: dict[str, str] = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",
    "x-vercel-ai-ui-message-stream": "v1",
}

Chunk = dict[str, Any]

# The finish reasons every supported major accepts; any other reason is sent as "other".
_FINISH_REASONS = frozenset({"stop", "length", "content-filter", "tool-calls", "error", "other"})
_OPENS_TURN = frozenset({"send", "retry"})
_CANCELLED_TEXT = "The call was cancelled."


def _check_protocol(protocol: int) -> int:
    if isinstance(protocol, bool) or not isinstance(protocol, int) or protocol < 5:
        raise InvalidEvent(f"protocol must be the ai package's major version, 5 or later, not {protocol!r}",
                           field="protocol")
    return protocol


def _state_json(state: SessionState | Mapping[str, Any] | None) -> dict[str, Any]:
    if state is None:
        return {"messages": [], "status": "idle"}
    if isinstance(state, SessionState):
        return state.to_json()
    return dict(state)


def _turn_view(messages: list[Any]) -> list[Any]:
    """The assistant messages after the last user message: what the client's reply is built from."""
    i = len(messages)
    while i > 0 and messages[i - 1]["role"] != "user":
        i -= 1
    return messages[i:]


def _error_text(error: Any) -> str:
    """A tool error as the one string the client shows."""
    if isinstance(error, str):
        return error
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return orjson.dumps(error).decode()


def _tool_error_text(part: Mapping[str, Any]) -> str:
    if "error" in part:
        return _error_text(part["error"])
    return _CANCELLED_TEXT


def _text_id(message_id: str, index: int) -> str:
    return f"{message_id}:{index}"


class UIMessageStreamEncoder:
    """Turns the actions of one turn into UI message stream chunks.

    Feed it every action the store appends for the turn, starting with the ``send`` or
    ``retry`` that opens it; each call returns the chunks to send for that action. A
    ``retry`` first replays what it keeps of the previous reply (the client dropped that
    reply when it asked to regenerate).

    Args:
        state_before: the session's state before the turn (a :class:`SessionState` or its
            JSON); ``None`` for an empty session.
        protocol: the major version of the client's ``ai`` package (5 or later).

    Raises:
        InvalidEvent: ``protocol`` is not an integer of at least 5.
    """

    def __init__(self, state_before: SessionState | Mapping[str, Any] | None, protocol: int = 5) -> None:
        self.protocol = _check_protocol(protocol)
        self._state = _state_json(state_before)
        # The assistant messages of this turn as the client holds them.
        self._sent: list[Any] = list(_turn_view(self._state["messages"]))
        self._started = bool(self._sent)
        self._open_text: str | None = None  # the id of the text part still streaming
        self._ended = False

    @property
    def ended(self) -> bool:
        """Whether the turn has finished, errored or been stopped (no more chunks follow)."""
        return self._ended

    @property
    def state(self) -> dict[str, Any]:
        """The session's state (JSON shape) after the actions fed so far."""
        return self._state

    def feed(self, action: Mapping[str, Any]) -> list[Chunk]:
        """The chunks for one more action of the turn.

        Args:
            action: an action as the store appends it (a trusted, validated dict).

        Returns:
            The chunks to send, in order; often one, sometimes none (a ``step-finish``, an
            action that changes nothing).
        """
        kind = action["type"]
        new = apply_action(self._state, action)
        out: list[Chunk] = []
        if kind in _OPENS_TURN:
            # A new reply: the client holds none of it yet.
            self._sent, self._started, self._open_text, self._ended = [], False, None, False
        view = _turn_view(new["messages"])
        self._diff(view, out)
        self._sent = list(view)
        self._state = new
        ending = self._ending(action)
        if ending is not None and not self._ended:
            self._close_text(out)
            if self._sent:
                out.append({"type": "finish-step"})
            out.extend(ending)
            self._ended = True
        return out

    def _ending(self, action: Mapping[str, Any]) -> list[Chunk] | None:
        kind = action["type"]
        if kind == "stop":
            return [{"type": "abort"}]
        if kind != "part" or action.get("within") is not None:
            return None
        part = action["part"]
        if part["type"] == "finish":
            reason = part.get("reason")
            if reason == "aborted":
                return [{"type": "abort"}]
            chunk: Chunk = {"type": "finish"}
            if reason is not None:
                chunk["finishReason"] = reason if reason in _FINISH_REASONS else "other"
            return [chunk]
        if part["type"] == "error":
            out: list[Chunk] = []
            if "code" in part:
                # The UI stream's error carries only text: the code goes to onData, unstored.
                out.append({"type": "data-error", "data": {"message": part["error"], "code": part["code"]},
                            "transient": True})
            out.append({"type": "error", "errorText": part["error"]})
            return out
        return None

    def _close_text(self, out: list[Chunk]) -> None:
        if self._open_text is not None:
            out.append({"type": "text-end", "id": self._open_text})
            self._open_text = None

    def _diff(self, view: list[Any], out: list[Chunk]) -> None:
        sent = self._sent
        for i, message in enumerate(view):
            old = sent[i] if i < len(sent) else None
            if old is message:
                continue
            if old is None:
                self._close_text(out)
                if not self._started:
                    out.append({"type": "start", "messageId": message["id"]})
                    self._started = True
                else:
                    out.append({"type": "finish-step"})
                out.append({"type": "start-step"})
                old_parts: list[Any] = []
            else:
                old_parts = old["parts"]
            for j, part in enumerate(message["parts"]):
                before = old_parts[j] if j < len(old_parts) else None
                if before is not part:
                    self._part(_text_id(message["id"], j), before, part, out)

    def _part(self, part_id: str, before: Any, part: Any, out: list[Chunk]) -> None:
        kind = part["type"]
        if kind == "text":
            text_id = part_id
            if before is None:
                self._close_text(out)
                out.append({"type": "text-start", "id": text_id})
                self._open_text = text_id
            done = len(before["text"]) if before is not None else 0
            if len(part["text"]) > done:
                out.append({"type": "text-delta", "id": text_id, "delta": part["text"][done:]})
        elif kind == "reasoning":
            if before is None:
                self._close_text(out)
                rid = part_id
                out.append({"type": "reasoning-start", "id": rid})
                out.append({"type": "reasoning-delta", "id": rid, "delta": part["text"]})
                out.append({"type": "reasoning-end", "id": rid})
        elif kind == "tool":
            self._tool(before, part, out)

    def _tool(self, before: Any, part: Any, out: list[Chunk]) -> None:
        call_id = part["id"]
        if before is None:
            self._close_text(out)
            out.append({"type": "tool-input-available", "toolCallId": call_id, "toolName": part["name"],
                        "input": part["input"]})
            old_state = "running"
        else:
            old_state = before["state"]
        state = part["state"]
        if state != old_state:
            if state == "done":
                out.append({"type": "tool-output-available", "toolCallId": call_id, "output": part.get("output")})
            elif state in ("error", "cancelled"):
                out.append({"type": "tool-output-error", "toolCallId": call_id, "errorText": _tool_error_text(part)})
            elif self.protocol >= 6 and state == "awaiting-confirmation":
                out.append({"type": "tool-approval-request", "approvalId": call_id, "toolCallId": call_id})
            elif self.protocol >= 6 and state == "running" and old_state == "awaiting-confirmation":
                out.append({"type": "tool-approval-response", "approvalId": call_id, "approved": True})
        agent = part.get("agent")
        if agent is not None and (before is None or before.get("agent") is not agent):
            out.append({"type": "data-agent", "id": call_id, "data": agent})


def _ui_tool(part: Mapping[str, Any], protocol: int) -> list[dict[str, Any]]:
    state = part["state"]
    ui: dict[str, Any] = {"type": f"tool-{part['name']}", "toolCallId": part["id"], "input": part["input"]}
    if state == "done":
        ui["state"] = "output-available"
        ui["output"] = part.get("output")
    elif state in ("error", "cancelled"):
        ui["state"] = "output-error"
        ui["errorText"] = _tool_error_text(part)
    elif protocol >= 6 and state == "awaiting-confirmation":
        ui["state"] = "approval-requested"
    else:
        ui["state"] = "input-available"
    if protocol >= 6 and (state == "awaiting-confirmation" or (state == "cancelled" and "prompt" in part)):
        # Still waiting for approval when it was requested or cancelled: the client got a request.
        ui["approval"] = {"id": part["id"]}
    out = [ui]
    if "agent" in part:
        out.append({"type": "data-agent", "id": part["id"], "data": part["agent"]})
    return out


def to_ui_messages(state: SessionState | Mapping[str, Any], protocol: int = 5) -> list[dict[str, Any]]:
    """The UI messages a client that streamed every turn of the session holds.

    A user message keeps its id and text; the assistant messages between two user
    messages become one UI message (the client merges a turn's messages into one, one
    step each) under the first one's id.

    Args:
        state: the session's state (a :class:`SessionState` or its JSON).
        protocol: the major version of the client's ``ai`` package (5 or later).

    Returns:
        The messages as JSON-shaped dicts (``id``, ``role``, ``parts``), oldest first.

    Raises:
        InvalidEvent: ``protocol`` is not an integer of at least 5.
    """
    _check_protocol(protocol)
    data = _state_json(state)
    messages = data["messages"]
    streaming = data["status"] == "streaming"
    out: list[dict[str, Any]] = []
    for n, message in enumerate(messages):
        if message["role"] == "user":
            text = "".join(p["text"] for p in message["parts"] if p["type"] == "text")
            out.append({"id": message["id"], "role": "user", "parts": [{"type": "text", "text": text}]})
            continue
        if out and out[-1]["role"] == "assistant":
            reply = out[-1]
        else:
            reply = {"id": message["id"], "role": "assistant", "parts": []}
            out.append(reply)
        parts = reply["parts"]
        parts.append({"type": "step-start"})
        last = n == len(messages) - 1
        for j, part in enumerate(message["parts"]):
            kind = part["type"]
            if kind == "text":
                # The encoder leaves a reply's last text open until the turn ends.
                open_ = streaming and last and j == len(message["parts"]) - 1
                parts.append({"type": "text", "text": part["text"], "state": "streaming" if open_ else "done"})
            elif kind == "reasoning":
                parts.append({"type": "reasoning", "id": _text_id(message["id"], j), "text": part["text"],
                              "state": "done"})
            elif kind == "tool":
                parts.extend(_ui_tool(part, protocol))
    return out


def session_ui_messages(actions: Iterable[Mapping[str, Any]], protocol: int = 5) -> list[dict[str, Any]]:
    """:func:`to_ui_messages` of the fold of ``actions`` (trusted, validated action dicts).

    Args:
        actions: a session's actions, oldest first.
        protocol: the major version of the client's ``ai`` package (5 or later).

    Returns:
        The UI messages, as :func:`to_ui_messages` gives them.
    """
    state: dict[str, Any] = {"messages": [], "status": "idle"}
    for action in actions:
        state = apply_action(state, action)
    return to_ui_messages(state, protocol)


def turns_of(actions: Iterable[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Split a session's actions into turns.

    Args:
        actions: a session's actions, oldest first.

    Returns:
        First the actions before the first turn (possibly ``[]``), then one list per turn,
        each opened by a ``send`` or a ``retry``.
    """
    turns: list[list[Mapping[str, Any]]] = [[]]
    for action in actions:
        if action["type"] in _OPENS_TURN:
            turns.append([])
        turns[-1].append(action)
    return turns


def sse(chunks: Iterable[Chunk], done: bool = True) -> Iterator[bytes]:
    """Chunks as Server-Sent Events: ``data: <json>`` each, then ``data: [DONE]``.

    Args:
        chunks: the chunks to send.
        done: whether to end with the ``[DONE]`` marker (the end of the response).

    Yields:
        One event's bytes per chunk.
    """
    for chunk in chunks:
        yield b"data: " + orjson.dumps(chunk) + b"\n\n"
    if done:
        yield b"data: [DONE]\n\n"
