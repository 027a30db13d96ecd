"""Stored text on a terminal: shown literally, never interpreted.

A chat log holds whatever a model or a user wrote, so everything the CLI prints from it
(message text, tool input and output, ids, actors, error messages) goes through
:func:`safe` first. Characters that a terminal would act on, or that change how text
reads, are shown as visible escapes such as ``\\x1b`` or ``\\u202e``: C0 and C1
controls (ESC sequences, NUL, BEL, DEL, CR), bidirectional overrides and isolates,
zero-width and other invisible format characters, Unicode tag characters, line and
paragraph separators and lone surrogates. Backslashes are left alone, so a message that
contains the four characters ``\\x1b`` reads the same as one that contained an ESC:
either way nothing reached the terminal. Rich markup is never parsed in human output
(consoles come from :func:`console`), so ``[/INST]`` or ``[bold]`` print as written.

``--json`` output keeps every value exact; :func:`json_text` only spells the same
characters as JSON ``\\u`` escapes, which decode to the identical string.
"""

from __future__ import annotations

import json
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["safe", "json_text", "console", "is_terminal", "UNSAFE"]

# Every code point of the categories Cc (controls), Cf (format), Zl, Zp and Cs
# (surrogates), as of Unicode 15; tests/test_cli_terminal.py checks this list against
# unicodedata so it cannot fall behind silently.
_OTHER_UNSAFE = (
    "\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
    "\ud800-\udfff"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)

#: Characters never written raw to a terminal.
UNSAFE = re.compile(f"[\x00-\x1f{_OTHER_UNSAFE}]")
#: The same, but newlines and tabs pass (for multi-line message bodies).
_UNSAFE_INLINE = re.compile(f"[\x00-\x08\x0b-\x1f{_OTHER_UNSAFE}]")
#: What json.dumps leaves raw (it escapes C0 controls itself; indentation uses \n).
_JSON_UNSAFE = re.compile(f"[{_OTHER_UNSAFE}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    n = ord(c)
    if n <= 0xFF:
        return f"\\x{n:02x}"
    if n <= 0xFFFF:
        return f"\\u{n:04x}"
    return f"\\U{n:08x}"


def safe(text: object, *, multiline: bool = False) -> str:
    """``text`` as a string with every unsafe character shown as a visible escape.

    Args:
        text: any value; non-strings are converted with ``str``.
        multiline: keep newlines and tabs (for message bodies); otherwise they are
            escaped too, so one stored value always prints on one line.
    """
    s = text if isinstance(text, str) else str(text)
    pattern = _UNSAFE_INLINE if multiline else UNSAFE
    if pattern.search(s) is None:
        return s
    return pattern.sub(_escape, s)


def _json_escape(m: re.Match[str]) -> str:
    n = ord(m.group())
    if n <= 0xFFFF:
        return f"\\u{n:04x}"
    n -= 0x10000
    return f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}"


def json_text(doc: Any, *, indent: int | None = 2) -> str:
    """``doc`` as JSON text: exact values, with unsafe characters as ``\\u`` escapes.

    Outside strings JSON has no such characters, so the substitution only ever touches
    string contents; the document decodes to the same values.
    """
    text = json.dumps(doc, ensure_ascii=False, default=str, indent=indent)
    return _JSON_UNSAFE.sub(_json_escape, text)


def is_terminal(stream: Any = None) -> bool:
    """Whether ``stream`` (default: stdout) is an interactive terminal."""
    stream = sys.stdout if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def console(*, stderr: bool = False, width: int | None = None) -> Console:
    """A Rich console that never interprets markup, emoji codes or highlighting.

    Created per call: the test runner swaps ``sys.stdout`` between invocations.
    """
    from rich.console import Console

    return Console(
        stderr=stderr, markup=False, emoji=False, highlight=False, soft_wrap=False, width=width
    )
