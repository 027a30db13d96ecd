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
import sys
from typing import TYPE_CHECKING, Any

from eventstore import UNSAFE, visible, visible_json

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["safe", "json_text", "console", "is_terminal", "UNSAFE"]


def safe(text: object, *, multiline: bool = False) -> str:
    """``text`` as a string with every unsafe character shown as a visible escape (the
    library's one rule, :func:`eventstore.visible`, which the audit report uses too).

    Args:
        text: any value; non-strings are converted with ``str``.
        multiline: keep newlines and tabs (for message bodies); otherwise they are
            escaped too, so one stored value always prints on one line.
    """
    return visible(text, multiline=multiline)


def json_text(doc: Any, *, indent: int | None = 2) -> str:
    """``doc`` as JSON text: exact values, with unsafe characters as ``\\u`` escapes.

    Outside strings JSON has no such characters, so the substitution only ever touches
    string contents; the document decodes to the same values.
    """
    return visible_json(json.dumps(doc, ensure_ascii=False, default=str, indent=indent))


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
