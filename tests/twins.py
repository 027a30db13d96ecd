"""The async twin seen through the sync store's API, for running one test suite on both.

Test-only: :class:`BlockingAsyncStore` drives an :class:`~eventstore.AsyncEventStore` on
a private event loop (each call runs one coroutine to completion) and turns its async
iterators into lists, so a test written against ``EventStore`` exercises the async twin
unchanged. Applications never do this: a sync caller uses ``EventStore``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any

import db_templates as templates
from eventstore import AsyncEventStore

__all__ = ["BlockingAsyncStore", "BlockingTurn", "make_async_store", "ITERATORS", "CONTEXTS"]

#: The methods that return an async iterator (a list here).
ITERATORS = ("history", "replay", "follow", "feed")
#: The methods that return an async context manager (a :class:`BlockingTurn` here).
CONTEXTS = ("turn",)


async def _collect(it: AsyncIterator[Any]) -> list[Any]:
    return [x async for x in it]


class BlockingAsyncStore:
    """An AsyncEventStore on a private event loop, with the sync store's call shapes."""

    def __init__(self, url: Any, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._async = AsyncEventStore(url, **options)
        except BaseException:
            self._loop.close()
            raise

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._async, name)
        if name in CONTEXTS:
            return lambda *a, **k: BlockingTurn(self._loop, attr(*a, **k))
        if name in ITERATORS:
            return lambda *a, **k: iter(self._loop.run_until_complete(_collect(attr(*a, **k))))
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **k: self._loop.run_until_complete(attr(*a, **k))
        return attr

    def take(self, name: str, n: int, *args: Any, **kwargs: Any) -> list[Any]:
        """The first ``n`` items of an async iterator method (``feed``, ``follow``), which may
        never end by itself."""

        async def first() -> list[Any]:
            out: list[Any] = []
            if n > 0:
                async for x in getattr(self._async, name)(*args, **kwargs):
                    out.append(x)
                    if len(out) == n:
                        break
            return out

        return self._loop.run_until_complete(first())

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self._async.close())
            self._loop.close()

    def __enter__(self) -> BlockingAsyncStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __iter__(self) -> Iterator[Any]:  # pragma: no cover - guards against misuse
        raise TypeError("not iterable")


class BlockingTurn:
    """An AsyncStreamingTurn with the sync turn's call shapes (``with``, ``write``, ...).

    The store's flusher task runs while a call runs the loop: a part that must be durable,
    ``flush`` and leaving the block all run it until they are done.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, turn: Any) -> None:
        self._loop = loop
        self._turn = turn

    def __enter__(self) -> BlockingTurn:
        self._loop.run_until_complete(self._turn.__aenter__())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._loop.run_until_complete(self._turn.__aexit__(exc_type, exc, tb))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._turn, name)
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **k: self._loop.run_until_complete(attr(*a, **k))
        return attr


def make_async_store(url: str, **options: Any) -> BlockingAsyncStore:
    """Like ``conftest.make_store``, for the async twin: migrated, ready to use."""
    return templates.migrated(BlockingAsyncStore, url, **options)
