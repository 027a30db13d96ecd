"""The asyncio pool both async engines use (eventstore.storage.sql.fair_pool): waiting
tasks get connections in the order they asked, its timeout still holds, and a task
cancelled once handed a connection gives it to the next one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.util import greenlet_spawn

from eventstore.storage.sql import FairAsyncQueuePool

T = TypeVar("T")


class _Conn:
    """A stand-in driver connection: the pool only opens, resets and closes them."""

    def rollback(self) -> None: ...

    def close(self) -> None: ...


def _pool(timeout: float = 30.0) -> FairAsyncQueuePool:
    return FairAsyncQueuePool(_Conn, pool_size=1, max_overflow=0, timeout=timeout)


async def _in_greenlet(fn: Callable[[], T]) -> T:
    return await greenlet_spawn(fn)


def test_waiting_tasks_get_the_connection_in_the_order_they_asked_even_its_last_holder() -> None:
    async def scenario() -> list[int]:
        pool = _pool()
        first = await _in_greenlet(pool.connect)
        order: list[int] = []

        async def waiter(n: int) -> None:
            conn = await _in_greenlet(pool.connect)
            order.append(n)
            await asyncio.sleep(0)
            await _in_greenlet(conn.close)

        def give_back_and_ask_again() -> None:
            first.close()
            conn = pool.connect()  # in the same step: the others asked first
            order.append(-1)
            conn.close()

        tasks = [asyncio.create_task(waiter(n)) for n in range(5)]
        await asyncio.sleep(0)  # every waiter is queued
        await _in_greenlet(give_back_and_ask_again)
        await asyncio.gather(*tasks)
        assert pool.checkedout() == 0
        return order

    assert asyncio.run(scenario()) == [0, 1, 2, 3, 4, -1]


def test_a_waiter_times_out_and_leaves_no_trace() -> None:
    async def scenario() -> None:
        pool = _pool(timeout=0.05)
        held = await _in_greenlet(pool.connect)
        with pytest.raises(PoolTimeout):
            await _in_greenlet(pool.connect)
        await _in_greenlet(held.close)
        again = await _in_greenlet(pool.connect)  # given back to the queue, not to the gone waiter
        await _in_greenlet(again.close)
        assert pool.checkedout() == 0

    asyncio.run(scenario())


def test_a_waiter_cancelled_after_being_handed_a_connection_passes_it_on() -> None:
    async def scenario() -> None:
        pool = _pool(timeout=5.0)
        held = await _in_greenlet(pool.connect)
        cancelled = asyncio.create_task(_in_greenlet(pool.connect))
        await asyncio.sleep(0)
        nxt: asyncio.Task[Any] = asyncio.create_task(_in_greenlet(pool.connect))
        await asyncio.sleep(0)
        await _in_greenlet(held.close)  # handed to `cancelled`, which has not run yet
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        conn = await asyncio.wait_for(nxt, 5.0)
        await _in_greenlet(conn.close)
        assert pool.checkedout() == 0

    asyncio.run(scenario())
