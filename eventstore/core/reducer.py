"""The session reducer: a pure state machine over the actions described in docs/format.md.

This module is PURE: it imports nothing from storage, reads no clock, makes no ids and
does no I/O; the same inputs always give the same output, and inputs are never mutated.

Public entry points:

- :func:`session_reducer` — one step, validating dict actions, returning a
  :class:`~eventstore.core.models.SessionState` (the *same object* when the step changed nothing).
- :func:`fold` — many steps over models or dicts.
- :func:`fold_json` — the store's trusted fast path: a JSON-shaped state dict and decoded
  action dicts in, a state dict out, no validation.
- :func:`resumable`, :func:`is_cancelled`, :func:`initial_state`.

How it stays fast and linear: the state is plain dicts and lists (the wire shape, docs/format.md). One
internal function (:func:`_apply`) applies an action by copying only the path it changes
(structural sharing). Within one fold, every container the fold has copied is recorded as
*owned* by that fold; later writes mutate owned containers in place instead of copying
them again. The fold never writes to a container it did not create, so its input stays
untouched, yet a text delta costs O(1) instead of O(messages).

Cost per event inside one fold: O(1) for ``send``, ``message-start``, ``step-finish``,
``finish`` and parts aimed at the newest message; ``tool-result`` / ``tool-error`` and
``within`` walk back from the newest part to the call (a cache makes repeated ``within``
O(1)); ``stop``, ``error``, ``finish(aborted)`` and ``toolPhase`` touch only the open
calls, which the fold tracks once it knows them all (from the start when the fold starts
empty, else after its first full scan). ``retry`` walks back to the last user message and
truncates in place. A part naming an unknown id scans the whole conversation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from eventstore.core.models import Action, SessionState, WireModel, parse_action, parse_state
from eventstore.errors import InvalidEvent

__all__ = [
    "REDUCER_VERSION",
    "session_reducer",
    "fold",
    "fold_json",
    "apply_action",
    "resumable",
    "is_cancelled",
    "initial_state",
    "parse_action",
]

REDUCER_VERSION: int = 1
"""Version of the reducer's semantics. The store tags snapshots with it; bump it whenever a
fold of the same events could give a different state, so stale snapshots are rebuilt."""

_OPEN = frozenset(("running", "awaiting-confirmation"))

Path = tuple[Any, ...]
"""Keys (``str`` for dicts, ``int`` for lists) leading from the root state to a container."""


class _Fold:
    """What one fold knows beyond the state itself.

    Attributes:
        owned: containers created by this fold, by ``id``. The values keep them alive so an
            id can never be reused by a foreign object while the fold runs.
        calls: ``within`` call id -> relative path of the newest tool part with that id.
            A cache for nested parts; only a ``tool-call`` (a newer call may shadow),
            ``retry`` or ``reset`` (paths change) can invalidate it.
        open: root-relative paths of every open call (an ordered set), or ``None`` while
            unknown (a state that did not start empty and has not been scanned yet). Lets
            ``stop`` / ``error`` / ``toolPhase`` cost O(open calls) instead of a walk over
            the whole conversation.
    """

    __slots__ = ("owned", "calls", "open")

    def __init__(self, *, empty: bool = False) -> None:
        self.owned: dict[int, Any] = {}
        self.calls: dict[str, Path] = {}
        self.open: dict[Path, None] | None = {} if empty else None


_T = TypeVar("_T")


def _own(obj: _T, ctx: _Fold) -> _T:
    """Register a container the fold just created (so later writes mutate it in place)."""
    ctx.owned[id(obj)] = obj
    return obj


def _mut(root: dict[str, Any], path: Path, ctx: _Fold) -> tuple[dict[str, Any], Any]:
    """Make every container from ``root`` down ``path`` writable; return (root, target).

    A container not owned by this fold is shallow-copied once and the copy put in its
    (already writable) parent, so only the changed path is copied and untouched siblings
    stay shared with the input.
    """
    owned = ctx.owned
    if id(root) not in owned:
        root = root.copy()
        owned[id(root)] = root
    cur: Any = root
    for key in path:
        child = cur[key]
        if id(child) not in owned:
            child = child.copy()
            owned[id(child)] = child
            cur[key] = child
        cur = child
    return root, cur


def _get(root: dict[str, Any], path: Path) -> Any:
    cur: Any = root
    for key in path:
        cur = cur[key]
    return cur


def _find_message(messages: list[Any], message_id: str) -> int:
    """Index of the newest message with ``message_id``, or -1."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["id"] == message_id:
            return i
    return -1


def _find_tool(messages: list[Any], match: Callable[[Any], bool]) -> Path | None:
    """Relative path (from ``messages``) of the newest tool part that ``match`` accepts.

    "Newest" is last in document order, where a call's nested messages come right after
    the call: walking backwards, a call's nested run is searched before the call itself.
    """
    for i in range(len(messages) - 1, -1, -1):
        parts = messages[i]["parts"]
        for j in range(len(parts) - 1, -1, -1):
            p = parts[j]
            if p["type"] != "tool":
                continue
            agent = p.get("agent")
            if agent is not None:
                sub = _find_tool(agent["messages"], match)
                if sub is not None:
                    return (i, "parts", j, "agent", "messages", *sub)
            if match(p):
                return (i, "parts", j)
    return None


def _find_call(messages: list[Any], call_id: str) -> Path | None:
    """Relative path (from ``messages``) of the newest tool part with ``call_id``."""
    return _find_tool(messages, lambda p: bool(p["id"] == call_id))


def _find_open_named(messages: list[Any], name: str) -> Path | None:
    """Relative path of the newest open call named ``name`` (same order as :func:`_find_call`)."""
    return _find_tool(messages, lambda p: bool(p["name"] == name and p["state"] in _OPEN))


def _open_calls(messages: list[Any], prefix: Path, out: list[Path]) -> list[Path]:
    """Append the relative paths of every open call, nested ones included."""
    for i, m in enumerate(messages):
        for j, p in enumerate(m["parts"]):
            if p["type"] != "tool":
                continue
            if p["state"] in _OPEN:
                out.append((*prefix, i, "parts", j))
            agent = p.get("agent")
            if agent is not None:
                _open_calls(agent["messages"], (*prefix, i, "parts", j, "agent", "messages"), out)
    return out


def _open_in(root: dict[str, Any], run: Path, ctx: _Fold) -> list[Path]:
    """Root-relative paths of the open calls inside the run at ``run`` (nested included)."""
    base = (*run, "messages")
    if ctx.open is not None:
        n = len(base)
        return [p for p in ctx.open if p[:n] == base]
    found = _open_calls(_get(root, base), base, [])
    if not run:
        ctx.open = {}  # a full scan: from here on the fold tracks every open call
        ctx.open.update(dict.fromkeys(found))
    return found


def _cancel(root: dict[str, Any], paths: list[Path], ctx: _Fold) -> dict[str, Any]:
    opened = ctx.open
    for path in paths:
        root, part = _mut(root, path, ctx)
        part["state"] = "cancelled"
        if opened is not None:
            opened.pop(path, None)
    return root


def _session_error(part: Mapping[str, Any]) -> dict[str, Any]:
    err: dict[str, Any] = {"message": part["error"]}
    code = part.get("code")
    if code is not None:
        err["code"] = code
    return err


# --------------------------------------------------------------------------- stream parts
# Each handler applies one part to the run at ``run_path`` ((), the session, or the path of
# a call's ``agent``) and returns the root: the same object when nothing changed.


def _message_start(root: dict[str, Any], run: Path, part: Mapping[str, Any], ctx: _Fold) -> dict[str, Any]:
    root, messages = _mut(root, (*run, "messages"), ctx)
    messages.append(
        _own({"id": part["messageId"], "role": "assistant", "parts": _own([], ctx)}, ctx)
    )
    return root


def _text_delta(root: dict[str, Any], run: Path, part: Mapping[str, Any], ctx: _Fold) -> dict[str, Any]:
    messages = _get(root, run)["messages"] if run else root["messages"]
    message_id = part["messageId"]
    # Deltas almost always extend the newest message: check it before scanning.
    i = len(messages) - 1
    if i < 0 or messages[i]["id"] != message_id:
        i = _find_message(messages, message_id)
        if i < 0:
            return root
    parts = messages[i]["parts"]
    if parts:
        last = parts[-1]
        if last["type"] == "text":
            text = part["text"]
            if id(last) in ctx.owned:
                # Owned by this fold, hence reachable only through this fold's state:
                # extend it in place without walking the path (the hot path of a load).
                last["text"] += text
                return root
            if not text:
                return root
            root, last = _mut(root, (*run, "messages", i, "parts", -1), ctx)
            last["text"] += text
            return root
    root, parts = _mut(root, (*run, "messages", i, "parts"), ctx)
    parts.append(_own({"type": "text", "text": part["text"]}, ctx))
    return root


def _append_part(
    root: dict[str, Any], run: Path, message_id: str, new: dict[str, Any], ctx: _Fold
) -> tuple[dict[str, Any], Path | None]:
    """``new`` appended to the parts of message ``message_id`` of the run: the root, and the
    path of the new part (``None``, and the root unchanged, when there is no such message)."""
    messages = _get(root, run)["messages"]
    i = _find_message(messages, message_id)
    if i < 0:
        return root, None
    root, parts = _mut(root, (*run, "messages", i, "parts"), ctx)
    parts.append(_own(new, ctx))
    return root, (*run, "messages", i, "parts", len(parts) - 1)


def _reasoning(root: dict[str, Any], run: Path, part: Mapping[str, Any], ctx: _Fold) -> dict[str, Any]:
    return _append_part(root, run, part["messageId"], {"type": "reasoning", "text": part["text"]}, ctx)[0]


def _tool_call(root: dict[str, Any], run: Path, part: Mapping[str, Any], ctx: _Fold) -> dict[str, Any]:
    call: dict[str, Any] = {"type": "tool", "id": part["id"], "name": part["name"]}
    if "input" in part:
        call["input"] = part["input"]
    call["state"] = "running"
    root, at = _append_part(root, run, part["messageId"], call, ctx)
    if at is not None:
        if ctx.open is not None:
            ctx.open[at] = None
        # This call is now the newest with its id: a cached `within` target may be stale.
        ctx.calls.pop(part["id"], None)
    return root


def _tool_outcome(root: dict[str, Any], run: Path, part: Mapping[str, Any], ctx: _Fold) -> dict[str, Any]:
    rel = _find_call(_get(root, run)["messages"], part["id"])
    if rel is None:
        return root
    path = (*run, "messages", *rel)
    root, call = _mut(root, path, ctx)
    if ctx.open is not None:
        ctx.open.pop(path, None)
    if part["type"] == "tool-result":
        call["state"] = "done"
        call["output"] = part.get("output")
        # The wire format: `error` is present only on a call that a tool-error ended.
        call.pop("error", None)
    else:
        error = part.get("error")
        call["state"] = "cancelled" if is_cancelled(error) else "error"
        call["error"] = error
        call.pop("output", None)
    return root


def _step_finish(root: dict[str, Any], run: Path, part: Mapping[str, Any], ctx: _Fold) -> dict[str, Any]:
    return root


def _finish(root: dict[str, Any], run: Path, part: Mapping[str, Any], ctx: _Fold) -> dict[str, Any]:
    opened = _open_in(root, run, ctx) if part.get("reason") == "aborted" else []
    if _get(root, run)["status"] == "idle" and not opened:
        return root
    root, target = _mut(root, run, ctx)
    target["status"] = "idle"
    return _cancel(root, opened, ctx)


def _error(root: dict[str, Any], run: Path, part: Mapping[str, Any], ctx: _Fold) -> dict[str, Any]:
    opened = _open_in(root, run, ctx)
    root, target = _mut(root, run, ctx)
    target["status"] = "error"
    target["error"] = _own(_session_error(part), ctx)
    return _cancel(root, opened, ctx)


_PARTS = {
    "message-start": _message_start,
    "text-delta": _text_delta,
    "reasoning": _reasoning,
    "tool-call": _tool_call,
    "tool-result": _tool_outcome,
    "tool-error": _tool_outcome,
    "step-finish": _step_finish,
    "finish": _finish,
    "error": _error,
}


# --------------------------------------------------------------------------- actions


def _send(root: dict[str, Any], action: Mapping[str, Any], ctx: _Fold) -> dict[str, Any]:
    root, messages = _mut(root, ("messages",), ctx)
    text = _own({"type": "text", "text": action["text"]}, ctx)
    messages.append(_own({"id": action["id"], "role": "user", "parts": _own([text], ctx)}, ctx))
    root["status"] = "streaming"
    root.pop("error", None)
    return root


def _part(root: dict[str, Any], action: Mapping[str, Any], ctx: _Fold) -> dict[str, Any]:
    part = action["part"]
    handler = _PARTS.get(part["type"])
    if handler is None:
        raise InvalidEvent(f"unknown stream part type {part['type']!r}", field="part.type")
    within = action.get("within")
    if within is None:
        return handler(root, (), part, ctx)
    rel = ctx.calls.get(within)
    if rel is None:
        rel = _find_call(root["messages"], within)
        if rel is None:
            return root  # within an unknown call: nothing happens
        ctx.calls[within] = rel
    call_path = ("messages", *rel)
    if "agent" not in _get(root, call_path):
        # The first nested part creates the run even when the part itself changes nothing.
        root, call = _mut(root, call_path, ctx)
        call["agent"] = _own({"messages": _own([], ctx), "status": "streaming"}, ctx)
    return handler(root, (*call_path, "agent"), part, ctx)


def _tool_phase(root: dict[str, Any], action: Mapping[str, Any], ctx: _Fold) -> dict[str, Any]:
    name = action["name"]
    path: Path | None
    if ctx.open is not None:
        # Paths compare in document order (a call's nested paths extend its own path,
        # so they sort right after it): the newest open call is the greatest path.
        named = [p for p in ctx.open if _get(root, p)["name"] == name]
        path = max(named) if named else None
    else:
        rel = _find_open_named(root["messages"], name)
        path = None if rel is None else ("messages", *rel)
    if path is None:
        return root
    root, call = _mut(root, path, ctx)
    call["state"] = action["state"]
    prompt = action.get("prompt")
    if prompt is None:
        call.pop("prompt", None)
    else:
        call["prompt"] = prompt
    return root


def _stop(root: dict[str, Any], action: Mapping[str, Any], ctx: _Fold) -> dict[str, Any]:
    opened = _open_in(root, (), ctx)
    if root["status"] == "idle" and not opened:
        return root
    root, _ = _mut(root, (), ctx)
    root["status"] = "idle"
    return _cancel(root, opened, ctx)


def _retry(root: dict[str, Any], action: Mapping[str, Any], ctx: _Fold) -> dict[str, Any]:
    point = _resume_point(root["messages"])
    if point is None:
        return root
    keep, cut = point
    ctx.calls.clear()
    # The same cut as resumable(), done by truncating the fold's own copies in place: a
    # new list per retry would make a retry-heavy fold quadratic in memory.
    root, messages = _mut(root, ("messages",), ctx)
    del messages[keep:]
    if cut >= 0:
        root, parts = _mut(root, ("messages", keep - 1, "parts"), ctx)
        del parts[cut:]
    root["status"] = "streaming"
    root.pop("error", None)
    if ctx.open:
        last, size = keep - 1, len(messages[-1]["parts"])
        ctx.open = {p: None for p in ctx.open if p[1] < last or (p[1] == last and p[3] < size)}
    return root


def _reset(root: dict[str, Any], action: Mapping[str, Any], ctx: _Fold) -> dict[str, Any]:
    ctx.calls.clear()
    ctx.open = {}
    return _own({"messages": _own([], ctx), "status": "idle"}, ctx)


_ACTIONS = {
    "send": _send,
    "part": _part,
    "toolPhase": _tool_phase,
    "stop": _stop,
    "retry": _retry,
    "reset": _reset,
}


def _apply(root: dict[str, Any], action: Mapping[str, Any], ctx: _Fold) -> dict[str, Any]:
    handler = _ACTIONS.get(action["type"])
    if handler is None:
        raise InvalidEvent(f"unknown action type {action['type']!r}", field="type")
    return handler(root, action, ctx)


# --------------------------------------------------------------------------- public API


def apply_action(state: dict[str, Any], action: Mapping[str, Any]) -> dict[str, Any]:
    """One trusted step on JSON-shaped data (no validation).

    Args:
        state: a state dict in the wire shape (never mutated).
        action: an action dict in the wire shape, assumed valid.

    Returns:
        The next state dict: ``state`` itself when nothing changed, else a new dict that
        copies only the changed path and shares everything else with ``state``.
    """
    return _apply(state, action, _Fold())


def fold_json(
    state: Mapping[str, Any] | None, actions: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """Fold trusted action dicts over a state dict: the store's load path.

    Linear in the number of actions (O(1) per text delta). Nothing is validated: pass only
    actions that went through :func:`parse_action` before they were stored.

    Args:
        state: the starting state dict (a snapshot), or ``None`` for the initial state.
            Never mutated.
        actions: decoded action dicts, oldest first.

    Returns:
        The final state dict. It may share nested containers with ``state``; treat both as
        immutable.
    """
    root: dict[str, Any]
    if state is None:
        root = {"messages": [], "status": "idle"}
    else:
        # Not copied: the first write copies it (see _mut), so a no-op fold returns it as is.
        root = state if type(state) is dict else dict(state)
    ctx = _Fold(empty=not root["messages"])
    handlers = _ACTIONS
    part_handlers = _PARTS
    owned = ctx.owned
    top: Path = ()
    for action in actions:
        # Dispatch inlined: nine events in ten are top-level parts, and each Python call
        # saved is a visible share of the per-event cost.
        kind = action["type"]
        if kind == "part" and action.get("within") is None:
            part = action["part"]
            part_type = part["type"]
            if part_type == "text-delta":
                # The commonest event of all, short-cut: a delta for the newest message
                # whose last part is a text part this fold already owns. Exactly what
                # _text_delta does in that case; every other case goes through it.
                messages = root["messages"]
                if messages:
                    message = messages[-1]
                    if message["id"] == part["messageId"]:
                        parts = message["parts"]
                        if parts:
                            last = parts[-1]
                            if last["type"] == "text" and id(last) in owned:
                                last["text"] += part["text"]
                                continue
            part_handler = part_handlers.get(part_type)
            if part_handler is None:
                raise InvalidEvent(f"unknown stream part type {part['type']!r}", field="part.type")
            root = part_handler(root, top, part, ctx)
            continue
        handler = handlers.get(kind)
        if handler is None:
            raise InvalidEvent(f"unknown action type {kind!r}", field="type")
        root = handler(root, action, ctx)
    return root


def _state_dict(state: SessionState | Mapping[str, Any] | None) -> tuple[SessionState, dict[str, Any]]:
    if state is None:
        s = initial_state()
    elif isinstance(state, SessionState):
        s = state
    else:
        s = parse_state(state)
    return s, s.to_json()


def _action_dict(action: Action | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(action, WireModel):
        return action.to_json()
    return parse_action(action).to_json()


def fold(
    actions: Iterable[Action | Mapping[str, Any]],
    state: SessionState | Mapping[str, Any] | None = None,
) -> SessionState:
    """Apply actions in order, starting from ``state`` (the initial state by default).

    Equivalent to repeated :func:`session_reducer` but linear in the number of actions.

    Args:
        actions: action models or dicts in the wire shape (dicts are validated).
        state: the starting state (model or dict); never mutated.

    Returns:
        The state after the last action (``state`` itself when there are none and it was
        a model).

    Raises:
        InvalidEvent: when an action is malformed (``index`` is its position).
    """
    start, root = _state_dict(state)
    ctx = _Fold(empty=not root["messages"])
    first = root
    for i, action in enumerate(actions):
        try:
            a = _action_dict(action)
        except InvalidEvent as exc:
            raise InvalidEvent(exc.reason, field=exc.field, index=i) from None
        root = _apply(root, a, ctx)
    if root is first:
        return start
    return SessionState.from_trusted(root)


def session_reducer(
    state: SessionState | Mapping[str, Any], action: Action | Mapping[str, Any]
) -> SessionState:
    """The next session state after one action (docs/format.md, "The reducer").

    Pure: never mutates ``state`` or ``action``, no I/O, deterministic.

    Args:
        state: the current state, a :class:`SessionState` or a dict in the wire shape (validated).
        action: an action model, or an action dict in the wire shape (validated with
            :func:`parse_action`).

    Returns:
        The next state; the *same object* as ``state`` (when it is a model) if the action
        changed nothing, e.g. a ``toolPhase`` matching no open call.

    Raises:
        InvalidEvent: when ``action`` is malformed.
    """
    a = _action_dict(action)
    start, root = _state_dict(state)
    new = _apply(root, a, _Fold())
    if new is root:
        return start
    return SessionState.from_trusted(new)


def resumable(messages: list[Any]) -> list[Any]:
    """What Retry sends: the conversation through the last finished call of the last turn.

    Keeps everything before the last user message, the last user message, and the
    following messages up to and including the last top-level tool part in ``done`` or
    ``error`` (parts after that call, in its message, are dropped). With no finished call
    after the last user message: the messages through the last user message. Without any
    user message: the messages unchanged. Only top-level tool parts count.

    Args:
        messages: the session's messages (plain dicts in the wire shape); not mutated.

    Returns:
        A new list. Unchanged messages are shared, a cut message is a new dict.
    """
    point = _resume_point(messages)
    if point is None:
        return list(messages)
    keep, cut = point
    kept = messages[:keep]
    if cut >= 0:
        kept[-1] = {**kept[-1], "parts": kept[-1]["parts"][:cut]}
    return kept


def _resume_point(messages: list[Any]) -> tuple[int, int] | None:
    """Where :func:`resumable` cuts: ``(keep, cut)`` or ``None`` without a user message.

    The first ``keep`` messages stay; when ``cut >= 0`` the last of them keeps only its
    first ``cut`` parts.
    """
    last_user = -1
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "user":
            last_user = i
            break
    if last_user < 0:
        return None
    for i in range(len(messages) - 1, last_user, -1):
        parts = messages[i]["parts"]
        for j in range(len(parts) - 1, -1, -1):
            p = parts[j]
            if p["type"] == "tool" and p["state"] in ("done", "error"):
                return i + 1, (j + 1 if j + 1 < len(parts) else -1)
    return last_user + 1, -1


def is_cancelled(error: Any) -> bool:
    """Whether a tool error means the call was cancelled: an object whose ``code`` is ``"cancelled"``.

    Args:
        error: the ``error`` of a ``tool-error`` part (any JSON), or an object with a
            ``code`` attribute.

    Returns:
        ``True`` for ``{"code": "cancelled", ...}``, else ``False``.
    """
    if isinstance(error, Mapping):
        return error.get("code") == "cancelled"
    if error is None or isinstance(error, (str, int, float, list)):
        return False
    return getattr(error, "code", None) == "cancelled"


def initial_state() -> SessionState:
    """A new, empty session: ``{"messages": [], "status": "idle"}``."""
    return SessionState.from_trusted({"messages": [], "status": "idle"})
