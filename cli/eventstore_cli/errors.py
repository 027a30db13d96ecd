"""How a command fails: one line on stderr, or one JSON object with ``--json``.

Expected failures exit with code 1 (library errors, unreadable input), usage errors
with code 2, an interrupt with 130. Human form: ``error: <message>`` on one line. With
``--json``: ``{"error": {"type": ..., "message": ...}}`` on stderr, same exit codes.
Messages pass through :func:`.terminal.safe`, since they may quote stored ids.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import typer

from .terminal import json_text, safe

__all__ = ["fail", "usage", "cli_errors", "json_mode", "emit_error", "UsageFailure"]

F = TypeVar("F", bound=Callable[..., Any])

# Whether the running command was given --json (set by cli_errors, read by fail).
_json = {"on": False}


def json_mode(on: bool) -> None:
    """Report errors of the running command as JSON (``--json``) or as text."""
    _json["on"] = bool(on)


def emit_error(kind: str, message: str) -> None:
    """Write one error report on stderr in the running command's form."""
    message = " ".join(safe(message).split())
    if _json["on"]:
        sys.stderr.write(json_text({"error": {"type": kind, "message": message}}, indent=None) + "\n")
    else:
        sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()


def fail(message: str, code: int = 1, kind: str = "Error") -> NoReturn:
    """Report ``message`` (``kind`` names it for programs) and exit with ``code``."""
    emit_error(kind, message)
    raise typer.Exit(code)


class UsageFailure(typer.BadParameter):
    """A usage error found by a command itself (exit code 2, like Typer's own)."""


def usage(message: str) -> NoReturn:
    """A usage error: exit code 2; reported as JSON with ``--json``."""
    if _json["on"]:
        fail(message, 2, "UsageError")
    raise UsageFailure(safe(message))


def _not_found_hint(exc: Exception) -> str:
    session = getattr(exc, "session", "")
    if "@" not in session:
        return str(exc)
    _, _, tail = session.rpartition("@")
    if tail.isascii() and tail.isdigit():
        return f"{exc} (this command takes a SESSION, not SESSION@VERSION)"
    return f"{exc} (in a ref, the version after the last '@' must be a number)"


def cli_errors(fn: F) -> F:
    """Turn every expected failure of a command into one report on stderr and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        json_mode(kwargs.get("as_json", False))
        # Imported here, not at the top: `eventstore --help` must not load the library.
        from eventstore import EventStoreError, SessionNotFound

        try:
            return fn(*args, **kwargs)
        except SessionNotFound as exc:
            fail(_not_found_hint(exc), kind=type(exc).__name__)
        except EventStoreError as exc:
            fail(str(exc), kind=type(exc).__name__)
        except FileNotFoundError as exc:
            fail(f"no such file: {exc.filename}", kind="FileNotFoundError")
        except IsADirectoryError as exc:
            fail(f"is a directory: {exc.filename}", kind="IsADirectoryError")
        except PermissionError as exc:
            fail(f"permission denied: {exc.filename}", kind="PermissionError")
        except OSError as exc:
            where = f": {exc.filename}" if exc.filename else ""
            fail(f"{exc.strerror or exc}{where}", kind="OSError")
        except UnicodeDecodeError as exc:
            fail(f"input is not UTF-8 text: {exc.reason}", kind="InputError")
        except RecursionError:  # json.loads of a hostile, deeply nested file
            fail("input is nested too deeply to be an action", kind="InputError")
        except KeyboardInterrupt:
            fail("interrupted", 130, "Interrupted")

    return wrapper  # type: ignore[return-value]
