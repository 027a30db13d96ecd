"""The asyncio connection pool both backends' async engines use: first come, first served.

SQLAlchemy's ``AsyncAdaptedQueuePool`` waits on an ``asyncio.Queue``. A connection given
back there only wakes the first waiting task; until that task next runs, the connection
sits in the queue, and any task asking meanwhile takes it without waiting — the very task
that gave it back, when it asks again in the same step (a loop of reads). The woken task
finds the queue empty and queues again, last. With many tasks on one loop a waiter can so
lose its turn again and again until its ``pool_timeout`` runs out, although every
connection is held for milliseconds: what 200 tasks on a loaded machine ran into.

Here a connection given back while tasks wait is handed to the one that has waited
longest, and a task finding connections in the queue takes one only when nobody waits
(then nobody can: a connection given back with a task waiting never enters the queue).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, TypeVar

from sqlalchemy.pool import AsyncAdaptedQueuePool, ConnectionPoolEntry
from sqlalchemy.util import await_
from sqlalchemy.util.queue import AsyncAdaptedQueue, Empty

__all__ = ["FairAsyncQueuePool"]

_T = TypeVar("_T")


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(Empty())


class _HandOffQueue(AsyncAdaptedQueue[_T]):
    """An ``AsyncAdaptedQueue`` whose items go to the waiting tasks in the order they
    came; used from engine code in a greenlet, as the one it replaces."""

    def __init__(self, maxsize: int = 0, use_lifo: bool = False) -> None:
        super().__init__(maxsize, use_lifo)
        self._waiters: deque[asyncio.Future[_T]] = deque()

    def put_nowait(self, item: _T) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():  # else timed out or cancelled: no longer waiting
                waiter.set_result(item)
                return
        super().put_nowait(item)

    def get(self, block: bool = True, timeout: float | None = None) -> _T:
        if not block or not self.empty():
            return self.get_nowait()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[_T] = loop.create_future()
        self._waiters.append(waiter)
        timer = None if timeout is None else loop.call_later(timeout, _expire, waiter)
        try:
            return await_(waiter)
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                # Handed a connection, then cancelled before taking it: the next one's.
                self.put_nowait(waiter.result())
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if waiter in self._waiters:  # timed out or cancelled: not handed anything
                self._waiters.remove(waiter)


class FairAsyncQueuePool(AsyncAdaptedQueuePool):
    """``AsyncAdaptedQueuePool`` (same arguments) serving waiting tasks in turn."""

    _queue_class = _HandOffQueue[ConnectionPoolEntry]
