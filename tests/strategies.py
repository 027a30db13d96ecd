"""Hypothesis strategies for actions in the wire shape (docs/format.md) (plain dicts).

Importable by every test module (the tests directory is on ``sys.path``)::

    from strategies import actions, action_lists, json_values

Ids come from tiny pools so that parts usually hit an existing message or call (and
sometimes do not): the interesting behaviour of the reducer is in the collisions.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

__all__ = [
    "json_values",
    "stream_parts",
    "actions",
    "action_lists",
    "MESSAGE_IDS",
    "CALL_IDS",
    "TOOL_NAMES",
]

MESSAGE_IDS = ("m1", "m2", "m3")
CALL_IDS = ("c1", "c2", "c3", "c4")
TOOL_NAMES = ("search", "add_to_cart")
ERROR_CODES = ("chat_disabled", "rate_limited", "bad_request", "network")

_message_ids = st.sampled_from(MESSAGE_IDS)
_call_ids = st.sampled_from(CALL_IDS)
_names = st.sampled_from(TOOL_NAMES)
_text = st.text(max_size=6)  # hypothesis never generates lone surrogates by default
_word = st.sampled_from(["a", "b", "Hello", " ", "é"])

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
"""Any JSON value that the store can carry (finite floats, 64-bit integers, valid text)."""


def _with_optional(base: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    if value is not None:
        base = {**base, key: value}
    return base


stream_parts: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.builds(lambda m: {"type": "message-start", "messageId": m}, _message_ids),
    st.builds(lambda m, t: {"type": "text-delta", "messageId": m, "text": t}, _message_ids, _text),
    # Non-empty deltas too, so that extending an existing text part is common.
    st.builds(lambda m, t: {"type": "text-delta", "messageId": m, "text": t}, _message_ids, _word),
    st.builds(lambda m, t: {"type": "text-delta", "messageId": m, "text": t}, _message_ids, _word),
    st.builds(lambda m, t: {"type": "reasoning", "messageId": m, "text": t}, _message_ids, _text),
    st.builds(
        lambda m, c, n, i: {"type": "tool-call", "messageId": m, "id": c, "name": n, "input": i},
        _message_ids,
        _call_ids,
        _names,
        json_values,
    ),
    st.builds(lambda c, o: {"type": "tool-result", "id": c, "output": o}, _call_ids, json_values),
    st.builds(
        lambda c, e: {"type": "tool-error", "id": c, "error": e},
        _call_ids,
        st.one_of(json_values, st.just({"code": "cancelled"})),
    ),
    st.just({"type": "step-finish"}),
    st.builds(
        lambda r: _with_optional({"type": "finish"}, "reason", r),
        st.sampled_from([None, "stop", "aborted", "length"]),
    ),
    st.builds(
        lambda e, c: _with_optional({"type": "error", "error": e}, "code", c),
        _text,
        st.sampled_from([None, *ERROR_CODES]),
    ),
)
"""One stream part (docs/format.md)."""

_part_actions = st.builds(
    lambda p, w: _with_optional({"type": "part", "part": p}, "within", w),
    stream_parts,
    st.sampled_from([None, None, None, *CALL_IDS]),
)

actions: st.SearchStrategy[dict[str, Any]] = st.one_of(
    _part_actions,
    _part_actions,
    _part_actions,
    _part_actions,
    st.builds(lambda i, t: {"type": "send", "id": i, "text": t}, st.sampled_from(["u1", "u2"]), _text),
    st.builds(
        lambda n, s, p: _with_optional({"type": "toolPhase", "name": n, "state": s}, "prompt", p),
        _names,
        st.sampled_from(["running", "awaiting-confirmation"]),
        st.one_of(st.none(), _text),
    ),
    st.just({"type": "stop"}),
    st.just({"type": "retry"}),
    st.just({"type": "reset"}),
)
"""One action (docs/format.md) as a plain dict; always passes ``parse_action``."""

action_lists: st.SearchStrategy[list[dict[str, Any]]] = st.lists(actions, max_size=40)
"""A session's worth of actions, oldest first."""
