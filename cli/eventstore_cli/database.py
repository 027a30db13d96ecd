"""Which database a command works on, and how refs name sessions and versions.

Only ``migrate`` and ``demo`` may create a database: every other command refuses a
SQLite URL whose file does not exist instead of leaving an empty file behind.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import fail, usage

if TYPE_CHECKING:
    from eventstore import EventStore

__all__ = ["DEFAULT_URL", "open_store", "parse_ref", "sqlite_file"]

DEFAULT_URL = "sqlite:///eventstore.db"


def sqlite_file(url: str) -> Path | None:
    """The file a ``sqlite://`` URL opens, or ``None`` (memory, a ``file:`` URI, not SQLite)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+")[0] != "sqlite" or not rest.startswith("/"):
        return None
    path, _, query = rest[1:].partition("?")
    if not path or path == ":memory:" or "uri=true" in query.lower() or path.startswith("file:"):
        return None
    return Path(path)


@contextmanager
def open_store(ctx: Any, *, create: bool = False) -> Iterator[EventStore]:
    """The store named by ``--db``; without ``create``, a missing SQLite file is an error."""
    from eventstore import EventStore, mask_url

    url = ctx.obj["db"] if ctx.obj else DEFAULT_URL
    path = sqlite_file(url)
    if not create and path is not None and not path.exists():
        fail(
            f"no database at {mask_url(url)} (the file {str(path)!r} does not exist); "
            "create it with `eventstore migrate`, or pass --db",
            kind="SchemaError",
        )
    with EventStore(url) as store:
        # The imports are done: what they built lives as long as the process, so it is
        # moved out of the collector's sight, and collection resumes for the command's own
        # objects (main() paused it for start-up; an embedding process keeps its own).
        if not gc.isenabled():
            gc.freeze()
            gc.enable()
        yield store


def parse_ref(text: str) -> tuple[str, int | None]:
    """``SESSION`` → (SESSION, None); ``SESSION@VERSION`` → (SESSION, VERSION).

    A ref splits at its last ``@`` only when digits follow, so ``ada@example.com`` is a
    session id and ``ada@example.com@3`` is its version 3.
    """
    from eventstore import split_ref

    session, version = split_ref(text)
    if not session:
        usage(f"bad ref {text!r}: expected SESSION or SESSION@VERSION")
    return session, version


def resolve_version(ref: str, at: int | None) -> tuple[str, int | None]:
    """The session and version of ``ref``, with ``--at`` as the alternative spelling."""
    session, version = parse_ref(ref)
    if at is not None:
        if version is not None and version != at:
            usage(f"{ref!r} and --at {at} name different versions; give one")
        version = at
    return session, version
