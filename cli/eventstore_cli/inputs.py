"""Reading actions from a file or stdin, strictly.

The input is a JSON array of actions, a single action object, or JSON Lines. Strict
means: a key repeated within one object is refused (JSON parsers differ on which copy
wins, so the stored event could differ from what the author reviewed), and so is an
integer literal too long to convert (over Python's 4300-digit limit) — both as one
clear line, never a traceback. Deciding whether an action is a valid action is the
library's job (``EventStore.append`` refuses the whole batch with the reason).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from eventstore import check_json_text

from .errors import fail

__all__ = ["read_actions", "loads_strict"]


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} appears twice in one object")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def loads_strict(text: str) -> Any:
    """``json.loads`` that refuses duplicate keys and unconvertible integers, and text
    nested too deeply (before parsing it, so a hostile file costs no memory).

    Raises:
        InvalidEvent: the text is nested deeper than an action may be.
        json.JSONDecodeError: the text is not JSON.
        ValueError: a key is repeated in one object, or a number cannot be converted;
            the message says which.
    """
    check_json_text(text)
    return json.loads(text, object_pairs_hook=_no_duplicates)


def _refuse(name: str, where: str, exc: ValueError) -> NoReturn:
    if isinstance(exc, json.JSONDecodeError):
        fail(f"{name}: {where}invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", kind="InputError")
    if isinstance(exc, _DuplicateKey):
        fail(f"{name}: {where}{exc}", kind="InputError")
    # int() refuses literals over sys.get_int_max_str_digits() digits with a ValueError.
    fail(f"{name}: {where}a number is too long to read ({str(exc).split(';')[0]})", kind="InputError")


def read_actions(path: str) -> list[dict[str, Any]]:
    """Actions from a JSON array, a single JSON object, or JSON Lines (``-`` = stdin)."""
    if path == "-":
        text = sys.stdin.read()
        name = "<stdin>"
    else:
        text = Path(path).read_text(encoding="utf-8")
        name = path
    stripped = text.strip()
    if not stripped:
        fail(f"{name}: no actions (empty input)", kind="InputError")
    if stripped[0] in "[{":
        doc: Any = None
        try:
            doc = loads_strict(stripped)
        except json.JSONDecodeError as exc:
            if stripped[0] == "[":
                _refuse(name, "", exc)
            # maybe JSON Lines of objects: read line by line below
        except ValueError as exc:
            _refuse(name, "", exc)
        if isinstance(doc, list):
            if not all(isinstance(a, dict) for a in doc):
                fail(f"{name}: every element of the array must be a JSON object (an action)", kind="InputError")
            return doc
        if isinstance(doc, dict):
            return [doc]
    actions: list[dict[str, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = loads_strict(line)
        except json.JSONDecodeError as exc:
            fail(
                f"{name}: line {n} is not valid JSON ({exc.msg}); expected a JSON array or JSON Lines",
                kind="InputError",
            )
        except ValueError as exc:
            _refuse(name, f"line {n}: ", exc)
        if not isinstance(obj, dict):
            fail(f"{name}: line {n} is not a JSON object (an action)", kind="InputError")
        actions.append(obj)
    return actions
