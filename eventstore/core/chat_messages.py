"""Session messages as the message lists of chat-completion APIs (PURE).

A continuation after crash recovery calls the model with the conversation so far
(:attr:`eventstore.Recovery.messages`, i.e. ``resumable`` of the state's messages). These
helpers turn those messages into what OpenAI's Chat Completions API and Anthropic's
Messages API take:

- user text becomes a ``user`` message;
- an assistant message becomes one ``assistant`` message with its text and its tool calls
  (OpenAI ``tool_calls`` / Anthropic ``tool_use`` blocks), followed by the results of its
  finished calls (OpenAI ``tool`` messages / Anthropic ``tool_result`` blocks in a ``user``
  message);
- reasoning parts and calls that never finished are left out: an API refuses a call
  without a result, so only ``done`` and ``error`` calls are sent (``resumable`` already
  cuts a reply after its last finished call).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from eventstore.errors import InvalidEvent

__all__ = ["to_anthropic_messages", "to_openai_messages"]

JSON = dict[str, Any]
_FINISHED = ("done", "error")


def _messages(messages: Any) -> list[Mapping[str, Any]]:
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
        raise InvalidEvent("messages must be a list of message objects", field="messages")
    out = list(messages)
    for i, m in enumerate(out):
        if not isinstance(m, Mapping) or m.get("role") not in ("user", "assistant"):
            raise InvalidEvent(
                "a message must be an object with role user or assistant", field="messages", index=i
            )
    return out


def _text(parts: Iterable[Mapping[str, Any]]) -> str:
    return "".join(str(p.get("text", "")) for p in parts if p.get("type") == "text")


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _result(tool: Mapping[str, Any]) -> tuple[str, bool]:
    """A finished call's result as text, and whether it is an error."""
    if tool.get("state") == "done":
        return _json_text(tool.get("output")), False
    return _json_text(tool.get("error")), True


def _finished_tools(parts: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [p for p in parts if p.get("type") == "tool" and p.get("state") in _FINISHED]


def to_openai_messages(messages: Any, *, system: str | None = None) -> list[JSON]:
    """The messages as OpenAI Chat Completions ``messages``.

    Args:
        messages: session messages in the wire shape (e.g. ``Recovery.messages`` or
            ``state.messages``).
        system: a system prompt to put first.

    Raises:
        InvalidEvent: ``messages`` is not a list of user/assistant message objects.
    """
    out: list[JSON] = [{"role": "system", "content": system}] if system is not None else []
    for m in _messages(messages):
        parts = list(m.get("parts", []))
        if m["role"] == "user":
            out.append({"role": "user", "content": _text(parts)})
            continue
        tools = _finished_tools(parts)
        msg: JSON = {"role": "assistant", "content": _text(parts) or None}
        if tools:
            msg["tool_calls"] = [
                {
                    "id": t["id"],
                    "type": "function",
                    "function": {"name": t["name"], "arguments": _json_text(t.get("input", {}))},
                }
                for t in tools
            ]
        if msg["content"] is None and not tools:
            continue
        out.append(msg)
        out.extend(
            {"role": "tool", "tool_call_id": t["id"], "content": _result(t)[0]} for t in tools
        )
    return out


def to_anthropic_messages(messages: Any) -> list[JSON]:
    """The messages as Anthropic Messages API ``messages`` (the system prompt is a
    separate argument of that API).

    Consecutive user turns (a tool result and the next user text) are merged into one
    ``user`` message, as the API requires alternating roles.

    Raises:
        InvalidEvent: ``messages`` is not a list of user/assistant message objects.
    """
    out: list[JSON] = []

    def add(role: str, blocks: list[JSON]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in _messages(messages):
        parts = list(m.get("parts", []))
        text = _text(parts)
        if m["role"] == "user":
            add("user", [{"type": "text", "text": text}])
            continue
        tools = _finished_tools(parts)
        blocks: list[JSON] = [{"type": "text", "text": text}] if text else []
        blocks += [
            {"type": "tool_use", "id": t["id"], "name": t["name"], "input": t.get("input", {})}
            for t in tools
        ]
        add("assistant", blocks)
        results: list[JSON] = []
        for t in tools:
            content, is_error = _result(t)
            block: JSON = {"type": "tool_result", "tool_use_id": t["id"], "content": content}
            if is_error:
                block["is_error"] = True
            results.append(block)
        add("user", results)
    return out
