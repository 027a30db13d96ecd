"""Writing the store's files (exports, archives, reports), never a truncated one.

No file is left truncated under its final name.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from eventstore.errors import InvalidEvent

__all__ = ["text_out"]


@contextlib.contextmanager
def text_out(out: Any, what: str = "out") -> Iterator[IO[str]]:
    """A text stream for ``out``: the object itself, or for a path ``PATH.part``, synced
    and renamed to ``PATH`` only once complete (a crash never leaves a truncated file
    under the name; a failure removes the partial file).

    Raises:
        InvalidEvent: ``out`` is neither a path nor a text file object.
    """
    if hasattr(out, "write"):
        yield out
        return
    if not isinstance(out, (str, os.PathLike)):
        raise InvalidEvent(
            f"{what} must be a path or a text file object, got {type(out).__name__}", field=what
        )
    path = Path(out)
    tmp = path.with_name(path.name + ".part")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
