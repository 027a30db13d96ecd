"""The async twin seen through the sync store's API, for running one test suite on both.

Test-only: :class:`BlockingAsyncStore` drives an :class:`~eventstore.AsyncEventStore` on
a private event loop and turns its async iterators into lists, so a test written against
``EventStore`` exercises the async twin unchanged. Applications never do this: a sync
caller uses ``EventStore``.

The loop runs on a thread of its own for the store's whole life, as an application's
loop does, and each call waits for its coroutine there. A loop run only during calls
would freeze the store's background tasks between them: a sealing round suspended inside
its SQLite write transaction held the database's lock, and the next writer (another store,
a test's own connection) waited on it until its busy timeout.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
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


class _Loop:
    """An event loop running on a daemon thread; :meth:`call` runs a coroutine on it and
    waits for its result (or its exception)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="twin-loop", daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()


class BlockingAsyncStore:
    """An AsyncEventStore on a private event loop, with the sync store's call shapes."""

    def __init__(self, url: Any, **options: Any) -> None:
        self._loop = _Loop()
        try:
            # Made on the loop: what the store binds to a loop is bound to this one.
            self._async = self._loop.call(_make(url, options))
        except BaseException:
            self._loop.close()
            raise

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._async, name)
        call = self._loop.call
        if name in CONTEXTS:
            return lambda *a, **k: BlockingTurn(call, attr(*a, **k))
        if name in ITERATORS:
            return lambda *a, **k: iter(call(_collect(attr(*a, **k))))
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **k: call(attr(*a, **k))
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

        return self._loop.call(first())

    def close(self) -> None:
        if not self._loop.loop.is_closed():
            try:
                self._loop.call(self._async.close())
            finally:
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

    Each call waits for its coroutine on the store's loop (where the turn's flusher task
    runs all along).
    """

    def __init__(self, call: Any, turn: Any) -> None:
        self._call = call
        self._turn = turn

    def __enter__(self) -> BlockingTurn:
        self._call(self._turn.__aenter__())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._call(self._turn.__aexit__(exc_type, exc, tb))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._turn, name)
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **k: self._call(attr(*a, **k))
        return attr


async def _make(url: Any, options: dict[str, Any]) -> AsyncEventStore:
    return AsyncEventStore(url, **options)


def make_async_store(url: str, **options: Any) -> BlockingAsyncStore:
    """Like ``conftest.make_store``, for the async twin: migrated, ready to use."""
    return templates.migrated(BlockingAsyncStore, url, **options)
