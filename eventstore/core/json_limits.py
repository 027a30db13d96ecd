"""What JSON the store accepts, checked with little memory: types, nesting depth and size.

Every value a caller hands in (an action, metadata, a state to import) is walked once, level
by level, without recursion and without building a location string per node (a location is
built only for the error), so a hostile value costs memory linear in its size and is refused
as soon as the walk passes :data:`MAX_JSON_DEPTH` levels or more text than the size budget:
a 50,000-deep object or a 50 MB string is refused before anything encodes or copies it.

JSON *text* (a CLI file, a line of JSON) can be checked for depth before it is parsed at all
(:func:`check_json_text`), so a parser never builds the deep value in the first place.

Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from eventstore.errors import InvalidEvent

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_STATE_DEPTH",
    "check_json",
    "is_plain_json",
    "check_json_text",
    "json_type",
]

#: The deepest nesting of objects and arrays accepted in an action or in metadata (the
#: action object itself is level 1). A state nests an action's values a few levels deeper
#: (and a sub-agent's run deeper still), and must stay within :data:`MAX_STATE_DEPTH`.
MAX_JSON_DEPTH = 128
#: The deepest nesting a state may have: orjson, which encodes every snapshot, refuses
#: anything deeper.
MAX_STATE_DEPTH = 254

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1  # orjson stores signed and unsigned 64-bit integers

# A JSON string literal (escapes included) or one bracket: the tokens that decide depth.
_DEPTH_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def _has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate: not Unicode text, and no encoder takes it
    (the walkers ask only for non-ASCII strings: the common case stays one C call)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def json_type(value: Any) -> str:
    """The JSON type name of a value (``"object"``, ``"number"``...), or its Python type's."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    return type(value).__name__


# A location is a linked chain (parent, key): O(1) per node, joined only for an error.
_Loc = tuple[Any, "str | int"] | None


def _path(base: str, loc: _Loc) -> str | None:
    keys: list[str] = []
    while loc is not None:
        loc, key = loc
        keys.append(str(key))
    keys.reverse()
    parts = ([base] if base else []) + keys
    return ".".join(parts) or None


def _too_big(what: str, floor: int, max_bytes: int, field: str | None) -> InvalidEvent:
    return InvalidEvent(
        f"{what} is at least {floor} bytes encoded, more than max_event_bytes={max_bytes}",
        field=field,
    )


def check_json(
    value: Any,
    path: str = "",
    *,
    max_depth: int = MAX_JSON_DEPTH,
    max_bytes: int | None = None,
    what: str = "the value",
) -> None:
    """Refuse anything JSON (and so the store) cannot carry, or that is too deep or too big.

    Accepts dicts with string keys, lists, strings, booleans, ``None``, integers within
    64 bits and finite floats, nested at most ``max_depth`` levels.

    Args:
        value: the value to check.
        path: dotted location of ``value``, used in the error.
        max_depth: the deepest nesting of objects and arrays accepted (``value`` itself,
            when an object or array, is level 1).
        max_bytes: when given, refuse as soon as the characters of its strings and keys
            alone exceed it (a lower bound of its encoded size, so nothing that would fit
            is refused), before anything encodes it.
        what: names the value in a size error (``"the action"``).

    Raises:
        InvalidEvent: at the first offending value, with ``field`` set to its dotted path
            (e.g. ``part.input.items.2``).
    """
    level: list[tuple[Any, _Loc]] = [(value, None)]
    depth = 0
    size = 0
    while level:
        nxt: list[tuple[Any, _Loc]] = []
        containers = False
        for v, loc in level:
            t = type(v)
            if t is str:
                size += len(v)
                if not v.isascii() and _has_lone_surrogate(v):
                    raise InvalidEvent(
                        "string contains a lone surrogate (not valid Unicode text)",
                        field=_path(path, loc),
                    )
            elif t is dict or t is list:
                if not containers:
                    containers = True
                    depth += 1
                    if depth > max_depth:
                        raise InvalidEvent(
                            f"nested more than {max_depth} levels deep", field=_path(path, loc)
                        )
                if t is dict:
                    for k, item in v.items():
                        if type(k) is not str:
                            raise InvalidEvent(
                                f"object keys must be strings, got {json_type(k)} {k!r}",
                                field=_path(path, loc),
                            )
                        nxt.append((k, loc))
                        nxt.append((item, (loc, k)))
                else:
                    nxt.extend((item, (loc, i)) for i, item in enumerate(v))
            elif t is float:
                if not math.isfinite(v):
                    raise InvalidEvent(
                        f"{v!r} is not a JSON number (NaN and Infinity cannot be stored)",
                        field=_path(path, loc),
                    )
            elif t is int:
                if not _INT_MIN <= v <= _INT_MAX:
                    raise InvalidEvent("integer does not fit in 64 bits", field=_path(path, loc))
            elif v is None or t is bool:
                pass
            else:
                raise InvalidEvent(
                    f"expected a JSON value, got {json_type(v)}", field=_path(path, loc)
                )
            if max_bytes is not None and size > max_bytes:
                raise _too_big(what, size, max_bytes, path or None)
        level = nxt


def is_plain_json(value: Any, max_depth: int = MAX_JSON_DEPTH, max_bytes: int | None = None) -> bool:
    """:func:`check_json` without the error: ``True`` when it would accept ``value``.

    The hot path of a batch append: no locations are kept (they are only needed for the
    error, which :func:`check_json` then produces).
    """
    level: list[Any] = [value]
    depth = 0
    size = 0
    isfinite = math.isfinite
    while level:
        nxt: list[Any] = []
        push, extend = nxt.append, nxt.extend
        containers = False
        for v in level:
            t = type(v)
            if t is str:
                size += len(v)
                if not v.isascii() and _has_lone_surrogate(v):
                    return False
            elif t is dict:
                containers = True
                for k in v:
                    if type(k) is not str:
                        return False
                    push(k)
                extend(v.values())
            elif t is list:
                containers = True
                extend(v)
            elif t is int:
                if not _INT_MIN <= v <= _INT_MAX:
                    return False
            elif t is float:
                if not isfinite(v):
                    return False
            elif v is not None and t is not bool:
                return False
        if containers:
            depth += 1
            if depth > max_depth:
                return False
        if max_bytes is not None and size > max_bytes:
            return False
        level = nxt
    return True


def check_json_text(
    text: str | bytes | bytearray, *, max_depth: int = MAX_JSON_DEPTH, what: str = "the JSON text"
) -> None:
    """Refuse JSON text nested deeper than ``max_depth`` before any parser builds it.

    Only string literals and brackets are looked at (one regular-expression pass), so the
    check costs memory proportional to one token, whatever the text. Text that is not JSON
    is left to the parser to refuse.

    Raises:
        InvalidEvent: it nests deeper than ``max_depth`` levels.
    """
    s = text.decode("utf-8", "replace") if isinstance(text, (bytes, bytearray)) else text
    if "[" not in s and "{" not in s:
        return
    depth = 0
    for m in _DEPTH_TOKENS.finditer(s):
        c = m.group()
        if c == "{" or c == "[":
            depth += 1
            if depth > max_depth:
                raise InvalidEvent(f"{what} is nested more than {max_depth} levels deep")
        elif c == "}" or c == "]":
            depth -= 1
