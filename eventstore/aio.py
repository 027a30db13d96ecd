"""The bridge that lets the one engine serve asyncio callers: greenlets, as in SQLAlchemy.

:class:`~eventstore.engine.Engine` and the feature modules are written once, as plain
functions over a :class:`~eventstore.storage.Storage`. The asyncio twin does not copy
them: it gives the engine a storage whose SQLAlchemy engine is the sync face of an
asyncio engine (psycopg's ``AsyncConnection`` on PostgreSQL, aiosqlite's per-connection
thread on SQLite) and runs each engine call with :func:`run`, inside a greenlet. Every
database round trip then suspends that greenlet and awaits the driver on the event loop
(SQLAlchemy's ``await_``); nothing blocks the loop but the Python work between two round
trips (validation, encoding, hashing, one fold). No thread pool, no nested event loop.

Adding an async twin of a new engine method is one line in the facade::

    async def feed(self, session: str) -> list[Item]:
        return await run(self._engine.feed, session)

and :func:`iterate` turns an engine method returning an iterator into an async iterator.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

from sqlalchemy.util import greenlet_spawn

__all__ = ["run", "iterate", "STEPS_PER_SWITCH"]

T = TypeVar("T")

#: Items an async iterator pulls from the engine's iterator per greenlet switch (one
#: storage chunk of a history; a replay folds this many single events at most).
STEPS_PER_SWITCH = 1000


async def run(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)`` in a greenlet whose database I/O awaits on this loop.

    ``fn`` is engine code over an asyncio-backed storage. Its exceptions propagate as they
    are (the same :class:`~eventstore.errors.EventStoreError` the sync store raises).
    """
    return await greenlet_spawn(fn, *args, **kwargs)


def _take(it: Iterator[T], n: int) -> list[T]:
    out: list[T] = []
    for item in it:
        out.append(item)
        if len(out) == n:
            break
    return out


async def iterate(
    fn: Callable[..., Iterator[T]], /, *args: Any, **kwargs: Any
) -> AsyncIterator[T]:
    """An async iterator over what ``fn(*args, **kwargs)`` yields.

    ``fn`` runs (its argument checks and first reads included) when iteration starts; the
    items are then pulled in slices of :data:`STEPS_PER_SWITCH`, each slice in a greenlet,
    so the storage reads they need await on the loop as well.
    """
    it = await run(fn, *args, **kwargs)
    while True:
        items = await run(_take, it, STEPS_PER_SWITCH)
        for item in items:
            yield item
        if len(items) < STEPS_PER_SWITCH:
            return
