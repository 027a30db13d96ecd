"""Pydantic v2 models of the wire shapes: actions, stream parts and the session state.

The shapes are those of docs/format.md.

Two kinds of model live here, on purpose:

- **Actions and stream parts** are frozen :class:`pydantic.BaseModel` classes (camelCase aliases,
  ``extra="forbid"``, strict types) joined in discriminated unions (:data:`Action`,
  :data:`StreamPart`). :func:`parse_action` turns untrusted JSON into one of them or raises
  :class:`~eventstore.errors.InvalidEvent` naming the field and the problem. ``.to_json()``
  gives back the exact wire dict.
- **The state** is JSON-shaped plain data. :class:`SessionState` is a frozen model whose
  ``messages`` are plain dicts typed by :class:`typing_extensions.TypedDict` classes
  (:class:`Message`, :class:`TextPart`, :class:`ReasoningPart`, :class:`ToolPart`,
  :class:`AgentRun`, :class:`SessionError`). Pydantic validates them fully on
  :meth:`SessionState.model_validate`, yet the reducer can fold thousands of events over
  plain dicts without building a model per event (see :mod:`eventstore.core.reducer`).

The nested dicts and lists of a state are shared between states (structural sharing):
treat everything reachable from ``state.messages`` or ``state.to_json()`` as immutable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, Union

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    ValidationError,
    model_validator,
    with_config,
)
from typing_extensions import NotRequired, TypedDict

from eventstore.core.json_limits import (
    MAX_JSON_DEPTH,
    MAX_STATE_DEPTH,
    check_json,
    check_json_text,
    is_plain_json,
    json_type,
)
from eventstore.errors import InvalidEvent, InvalidState

__all__ = [
    # state
    "SessionState",
    "Message",
    "MessagePart",
    "TextPart",
    "ReasoningPart",
    "ToolPart",
    "AgentRun",
    "SessionError",
    "Status",
    "ToolState",
    "ErrorCode",
    # stream parts
    "StreamPart",
    "MessageStartPart",
    "TextDeltaPart",
    "ReasoningDeltaPart",
    "ToolCallPart",
    "ToolResultPart",
    "ToolErrorPart",
    "StepFinishPart",
    "FinishPart",
    "ErrorPart",
    # actions
    "Action",
    "SendAction",
    "PartAction",
    "ToolPhaseAction",
    "StopAction",
    "RetryAction",
    "ResetAction",
    "ACTION_TYPES",
    "PART_TYPES",
    # parsing
    "WireModel",
    "parse_action",
    "parse_state",
    "parse_actions",
    "parse_action_json",
    "check_json",
]

Status = Literal["idle", "streaming", "error"]
ToolState = Literal["running", "awaiting-confirmation", "done", "error", "cancelled"]
ErrorCode = Literal["chat_disabled", "rate_limited", "bad_request", "network"]

# Strict: JSON has no implicit conversions, so neither do we (``5`` is not a string).
_TD_CONFIG = ConfigDict(extra="forbid", strict=True)


# --------------------------------------------------------------------------- state


@with_config(_TD_CONFIG)
class SessionError(TypedDict):
    """The last failure of a run: ``{"message": str, "code"?: ErrorCode}``."""

    message: str
    code: NotRequired[ErrorCode]


@with_config(_TD_CONFIG)
class TextPart(TypedDict):
    """Visible text of a message: ``{"type": "text", "text": str}``."""

    type: Literal["text"]
    text: str


@with_config(_TD_CONFIG)
class ReasoningPart(TypedDict):
    """Model reasoning kept for the next request: ``{"type": "reasoning", "text": str}``."""

    type: Literal["reasoning"]
    text: str


@with_config(_TD_CONFIG)
class ToolPart(TypedDict):
    """One tool call and its outcome.

    ``output`` is present once the call is ``done``; ``error`` when a ``tool-error`` made it
    ``error`` or ``cancelled``; ``prompt`` while set by ``toolPhase``; ``agent`` once a
    part was sent ``within`` this call. ``input``, ``output`` and ``error`` are any JSON,
    ``null`` included (the key is then present with a ``None`` value).
    """

    type: Literal["tool"]
    id: str
    name: str
    input: NotRequired[JsonValue]
    state: ToolState
    output: NotRequired[JsonValue]
    error: NotRequired[JsonValue]
    prompt: NotRequired[str]
    agent: NotRequired[AgentRun]


MessagePart = Annotated[Union[TextPart, ReasoningPart, ToolPart], Field(discriminator="type")]
"""A part of a stored message, discriminated on ``type``."""


@with_config(_TD_CONFIG)
class Message(TypedDict):
    """A user or assistant message: ``{"id", "role", "parts"}``."""

    id: str
    role: Literal["user", "assistant"]
    parts: list[MessagePart]


@with_config(_TD_CONFIG)
class AgentRun(TypedDict):
    """A sub-agent's run nested under a tool call: ``{"messages", "status", "error"?}``."""

    messages: list[Message]
    status: Status
    error: NotRequired[SessionError]


class SessionState(BaseModel):
    """The chat session: its messages, whether a run is streaming, and the last error.

    ``messages`` holds plain dicts in the wire shape. States share nested structures
    with each other and with what :meth:`to_json` returns, so callers must never mutate
    them; build new states with the reducer instead.

    Construct with :meth:`model_validate` for untrusted JSON (full validation, including
    NaN/Infinity and lone surrogates, which JSON cannot carry) or :meth:`from_trusted` for
    data the store wrote itself (no validation, O(1)).

    Example:
        >>> s = SessionState.model_validate({"messages": [], "status": "idle"})
        >>> s.to_json()
        {'messages': [], 'status': 'idle'}
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, defer_build=True)

    messages: list[Message]
    status: Status
    error: SessionError | None = None

    @model_validator(mode="before")
    @classmethod
    def _json_only(cls, data: Any) -> Any:
        # Pydantic lets NaN, Infinity and lone surrogates through; JSON (and orjson) cannot
        # store them, so refuse them here rather than at the next write.
        if isinstance(data, Mapping):
            try:
                check_json(data, max_depth=MAX_STATE_DEPTH)
            except InvalidEvent as exc:
                raise ValueError(str(exc)) from None
        return data

    @classmethod
    def from_trusted(cls, data: Mapping[str, Any]) -> SessionState:
        """Wrap a state dict without validating it (for data eventstore produced itself).

        Args:
            data: a dict in the wire shape of a state; it is shared, not copied.

        Returns:
            The state. Passing anything not produced by the reducer or
            :meth:`to_json` gives undefined results.
        """
        return cls.model_construct(
            messages=data["messages"], status=data["status"], error=data.get("error")
        )

    def to_json(self) -> dict[str, Any]:
        """The state object in its wire shape: ``{"messages", "status", "error"?}``.

        Returns:
            A new top-level dict; ``error`` is omitted when unset. The nested messages are
            shared with this state (no deep copy): treat them as immutable.
        """
        out: dict[str, Any] = {"messages": self.messages, "status": self.status}
        if self.error is not None:
            out["error"] = self.error
        return out


# --------------------------------------------------------------------------- stream parts


class WireModel(BaseModel):
    """Common configuration of every action and stream part model."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=True, populate_by_name=True, defer_build=True
    )

    def to_json(self) -> dict[str, Any]:  # pragma: no cover - every subclass overrides
        """The exact wire dict (camelCase, optional keys omitted)."""
        raise NotImplementedError


class MessageStartPart(WireModel):
    """``{"type": "message-start", "messageId"}``: appends an empty assistant message."""

    type: Literal["message-start"] = "message-start"
    message_id: str = Field(alias="messageId")

    def to_json(self) -> dict[str, Any]:
        """The wire dict."""
        return {"type": self.type, "messageId": self.message_id}


class TextDeltaPart(WireModel):
    """``{"type": "text-delta", "messageId", "text"}``: extends the message's text."""

    type: Literal["text-delta"] = "text-delta"
    message_id: str = Field(alias="messageId")
    text: str

    def to_json(self) -> dict[str, Any]:
        """The wire dict."""
        return {"type": self.type, "messageId": self.message_id, "text": self.text}


class ReasoningDeltaPart(WireModel):
    """``{"type": "reasoning", "messageId", "text"}``: adds a reasoning part."""

    type: Literal["reasoning"] = "reasoning"
    message_id: str = Field(alias="messageId")
    text: str

    def to_json(self) -> dict[str, Any]:
        """The wire dict."""
        return {"type": self.type, "messageId": self.message_id, "text": self.text}


class ToolCallPart(WireModel):
    """``{"type": "tool-call", "messageId", "id", "name", "input"}``: a call starts running."""

    type: Literal["tool-call"] = "tool-call"
    message_id: str = Field(alias="messageId")
    id: str
    name: str
    input: JsonValue

    def to_json(self) -> dict[str, Any]:
        """The wire dict (``input`` kept even when ``null``)."""
        return {
            "type": self.type,
            "messageId": self.message_id,
            "id": self.id,
            "name": self.name,
            "input": self.input,
        }


class ToolResultPart(WireModel):
    """``{"type": "tool-result", "id", "output"}``: the call is ``done``."""

    type: Literal["tool-result"] = "tool-result"
    id: str
    output: JsonValue

    def to_json(self) -> dict[str, Any]:
        """The wire dict (``output`` kept even when ``null``)."""
        return {"type": self.type, "id": self.id, "output": self.output}


class ToolErrorPart(WireModel):
    """``{"type": "tool-error", "id", "error"}``: the call failed or was cancelled."""

    type: Literal["tool-error"] = "tool-error"
    id: str
    error: JsonValue

    def to_json(self) -> dict[str, Any]:
        """The wire dict (``error`` kept even when ``null``)."""
        return {"type": self.type, "id": self.id, "error": self.error}


class StepFinishPart(WireModel):
    """``{"type": "step-finish"}``: changes nothing."""

    type: Literal["step-finish"] = "step-finish"

    def to_json(self) -> dict[str, Any]:
        """The wire dict."""
        return {"type": self.type}


class FinishPart(WireModel):
    """``{"type": "finish", "reason"?}``: the run ends; ``"aborted"`` cancels open calls."""

    type: Literal["finish"] = "finish"
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The wire dict (``reason`` omitted when unset)."""
        out: dict[str, Any] = {"type": self.type}
        if self.reason is not None:
            out["reason"] = self.reason
        return out


class ErrorPart(WireModel):
    """``{"type": "error", "error": str, "code"?}``: the run fails; open calls are cancelled."""

    type: Literal["error"] = "error"
    error: str
    code: ErrorCode | None = None

    def to_json(self) -> dict[str, Any]:
        """The wire dict (``code`` omitted when unset)."""
        out: dict[str, Any] = {"type": self.type, "error": self.error}
        if self.code is not None:
            out["code"] = self.code
        return out


StreamPart = Annotated[
    Union[
        MessageStartPart,
        TextDeltaPart,
        ReasoningDeltaPart,
        ToolCallPart,
        ToolResultPart,
        ToolErrorPart,
        StepFinishPart,
        FinishPart,
        ErrorPart,
    ],
    Field(discriminator="type"),
]
"""One part an adapter streams, discriminated on ``type``."""


# --------------------------------------------------------------------------- actions


class SendAction(WireModel):
    """``{"type": "send", "id", "text"}``: the user sends a message."""

    type: Literal["send"] = "send"
    id: str
    text: str

    def to_json(self) -> dict[str, Any]:
        """The wire dict."""
        return {"type": self.type, "id": self.id, "text": self.text}


class PartAction(WireModel):
    """``{"type": "part", "part", "within"?}``: apply a stream part (to a call's nested run)."""

    type: Literal["part"] = "part"
    part: StreamPart
    within: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The wire dict (``within`` omitted when unset)."""
        out: dict[str, Any] = {"type": self.type, "part": self.part.to_json()}
        if self.within is not None:
            out["within"] = self.within
        return out


class ToolPhaseAction(WireModel):
    """``{"type": "toolPhase", "name", "state", "prompt"?}``: a running tool changes phase."""

    type: Literal["toolPhase"] = "toolPhase"
    name: str
    state: Literal["running", "awaiting-confirmation"]
    prompt: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The wire dict (``prompt`` omitted when unset)."""
        out: dict[str, Any] = {"type": self.type, "name": self.name, "state": self.state}
        if self.prompt is not None:
            out["prompt"] = self.prompt
        return out


class StopAction(WireModel):
    """``{"type": "stop"}``: the user stops the run; open calls are cancelled."""

    type: Literal["stop"] = "stop"

    def to_json(self) -> dict[str, Any]:
        """The wire dict."""
        return {"type": self.type}


class RetryAction(WireModel):
    """``{"type": "retry"}``: start the turn again from :func:`~eventstore.core.reducer.resumable`."""

    type: Literal["retry"] = "retry"

    def to_json(self) -> dict[str, Any]:
        """The wire dict."""
        return {"type": self.type}


class ResetAction(WireModel):
    """``{"type": "reset"}``: back to the empty session."""

    type: Literal["reset"] = "reset"

    def to_json(self) -> dict[str, Any]:
        """The wire dict."""
        return {"type": self.type}


Action = Annotated[
    Union[SendAction, PartAction, ToolPhaseAction, StopAction, RetryAction, ResetAction],
    Field(discriminator="type"),
]
"""One event of a session, discriminated on ``type``."""

ACTION_TYPES: tuple[str, ...] = ("send", "part", "toolPhase", "stop", "retry", "reset")
"""The valid action ``type`` values, in the order docs/format.md lists them."""

PART_TYPES: tuple[str, ...] = (
    "message-start",
    "text-delta",
    "reasoning",
    "tool-call",
    "tool-result",
    "tool-error",
    "step-finish",
    "finish",
    "error",
)
"""The valid stream part ``type`` values, in the order docs/format.md lists them."""

_ACTION_CLASSES = (SendAction, PartAction, ToolPhaseAction, StopAction, RetryAction, ResetAction)
# Validators are built on first use (``defer_build``), not at import: a command that only
# reads the log never pays for them.
_DEFERRED = ConfigDict(defer_build=True)
_ACTION_ADAPTER: TypeAdapter[Any] = TypeAdapter(Action, config=_DEFERRED)
# A whole batch in one call into pydantic-core (parse_actions' fast path).
_ACTIONS_ADAPTER: TypeAdapter[Any] = TypeAdapter(list[Action], config=_DEFERRED)


# --------------------------------------------------------------------------- parsing

def _join(path: str, key: str | int) -> str:
    return f"{path}.{key}" if path else str(key)


def _loc_to_field(loc: tuple[int | str, ...], obj: Mapping[str, Any]) -> tuple[str, ...]:
    """Drop the discriminator tags pydantic puts into error locations.

    ``('part', 'text-delta', 'text')`` becomes ``('part', 'text')``.
    """
    items = [str(x) for x in loc]
    if items and items[0] in ACTION_TYPES:
        action_type = items.pop(0)
        if action_type == "part" and len(items) >= 2 and items[0] == "part":
            if items[1] in PART_TYPES:
                del items[1]
    return tuple(items)


def _data_path(loc: tuple[int | str, ...], obj: Any) -> list[str]:
    """The part of an error location that exists in the data: union tags are dropped.

    Pydantic puts the discriminator value of a tagged union into the location
    (``parts.0.text.text`` for the ``text`` field of a ``text`` part); it names no data.
    """
    path: list[str] = []
    node, tag_skipped = obj, False
    for key in loc:
        if isinstance(node, Mapping) and not tag_skipped and node.get("type") == key:
            tag_skipped = True
            continue
        path.append(str(key))
        if isinstance(node, Mapping) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            node = node[key]
        else:
            node = None
        tag_skipped = False
    return path


def _reason(err: Mapping[str, Any], field: str) -> str:
    kind = err["type"]
    got = err.get("input")
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown field (not part of this action's shape)"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        valid = PART_TYPES if field.startswith("part") else ACTION_TYPES
        what = "stream part" if field.startswith("part") else "action"
        listed = ", ".join(valid)
        if kind == "union_tag_not_found":
            return f"missing 'type'; the {what} type is one of: {listed}"
        tag = err.get("ctx", {}).get("tag", got)
        return f"unknown {what} type {tag!r}; valid types: {listed}"
    if kind in ("string_type", "str_type"):
        return f"expected a string, got {json_type(got)}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"expected an object, got {json_type(got)}"
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        return f"expected {expected}, got {got!r}"
    return f"{err['msg']} (got {json_type(got)})"


def parse_action(obj: Mapping[str, Any] | Action, *, max_bytes: int | None = None) -> Action:
    """Validate one action (a JSON object in the wire shape) into its model.

    Args:
        obj: a dict as decoded from JSON, or an already validated action model (returned
            as is).
        max_bytes: when given, refuse an action whose strings alone exceed it, before
            validating or encoding it (see :func:`eventstore.core.json_limits.check_json`).

    Returns:
        The validated action: one of :class:`SendAction`, :class:`PartAction`,
        :class:`ToolPhaseAction`, :class:`StopAction`, :class:`RetryAction`,
        :class:`ResetAction`.

    Raises:
        InvalidEvent: when ``obj`` is not a JSON object, has an unknown ``type``, lacks a
            field, has an unknown field or a field of the wrong type, or carries something
            JSON cannot (NaN, Infinity, lone surrogates), or is nested deeper than
            :data:`~eventstore.core.json_limits.MAX_JSON_DEPTH` levels. ``field`` is the
            dotted location (``"part.messageId"``) and ``reason`` says what is wrong.
    """
    if isinstance(obj, _ACTION_CLASSES):
        return obj
    if not isinstance(obj, Mapping):
        raise InvalidEvent(f"an action must be a JSON object, got {json_type(obj)}")
    data = obj if type(obj) is dict else dict(obj)
    check_json(data, max_bytes=max_bytes, what="the action")
    try:
        # by_name=False: the wire is camelCase only; snake_case names are for Python callers.
        action: Action = _ACTION_ADAPTER.validate_python(data, by_alias=True, by_name=False)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        field = ".".join(_loc_to_field(first["loc"], data))
        if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
            field = _join(field, "type")
        reason = _reason(first, field)
        if len(errors) > 1:
            reason += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
        raise InvalidEvent(reason, field=field or None) from None
    return action


def parse_state(obj: Mapping[str, Any] | SessionState) -> SessionState:
    """Validate a session state (a state object in the wire shape) into a :class:`SessionState`.

    Raises:
        InvalidState: when ``obj`` is not a valid state; ``field`` is the dotted location.
    """
    if isinstance(obj, SessionState):
        return obj
    if not isinstance(obj, Mapping):
        raise InvalidState(f"a state must be a JSON object, got {json_type(obj)}")
    try:
        return SessionState.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = ".".join(_data_path(first["loc"], obj))
        raise InvalidState(_reason(first, field), field=field or None) from None


def parse_actions(
    actions: Iterable[Mapping[str, Any] | Action], *, max_bytes: int | None = None
) -> list[Action]:
    """Validate a batch of actions; the error names the offending position.

    Args:
        actions: dicts as decoded from JSON, or action models.
        max_bytes: as for :func:`parse_action`, per action.

    Returns:
        The validated actions, in order.

    Raises:
        InvalidEvent: for the first malformed action, with ``index`` set to its position.
    """
    items = actions if type(actions) is list else list(actions)
    if items and all(type(a) is dict and is_plain_json(a, MAX_JSON_DEPTH, max_bytes) for a in items):
        # Fast path: one pydantic-core call for the batch. On any problem, fall through to
        # the per-action loop, which finds the first bad action and words the error.
        try:
            batch: list[Action] = _ACTIONS_ADAPTER.validate_python(
                items, by_alias=True, by_name=False
            )
            return batch
        except ValidationError:
            pass
    out: list[Action] = []
    for i, obj in enumerate(items):
        try:
            out.append(parse_action(obj, max_bytes=max_bytes))
        except InvalidEvent as exc:
            raise InvalidEvent(exc.reason, field=exc.field, index=i) from None
    return out


def parse_action_json(data: bytes | bytearray | memoryview | str) -> Action:
    """Decode and validate one action from raw JSON text.

    Args:
        data: the JSON text of one action.

    Returns:
        The validated action.

    Raises:
        InvalidEvent: when the text is not valid JSON or not a valid action.
    """
    check_json_text(data if not isinstance(data, memoryview) else bytes(data), what="the action")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidEvent(f"malformed JSON: {exc}") from None
    return parse_action(obj)

