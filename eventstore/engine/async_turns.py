"""Streaming turns for asyncio: the twin of :mod:`eventstore.engine.turns`.

The same :class:`~eventstore.core.turn_rules.TurnState` decisions and the same I/O functions
(:func:`~eventstore.engine.turns.open_locked`, :func:`~eventstore.engine.turns.flush_turns`,
:func:`~eventstore.engine.turns.release_lease`, run in a greenlet by :func:`eventstore.engine.async_bridge.run`
so that each round trip awaits on the loop); only the waiting differs: one
:class:`asyncio.Condition` instead of threading conditions, and the flusher is a task of
the loop instead of a thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from eventstore.core.turn_rules import INTERRUPTION, MAX_PENDING, Pending, TurnState, turn_action
from eventstore.engine.async_bridge import run
from eventstore.engine.engine import Engine
from eventstore.engine.turns import (
    LOCKED_OPENINGS,
    TurnView,
    TurnWriterBase,
    claiming_turn,
    flush_error,
    flush_turns,
    open_locked,
    prepare_opening,
    release_lease,
)
from eventstore.errors import EventStoreError, InvalidEvent

__all__ = ["AsyncStreamingTurn", "AsyncTurnWriter"]


class AsyncTurnWriter(TurnWriterBase):
    """The group committer of one async store: open turns and the flusher task."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        # flush_turns records outcomes under this lock; on the loop's one thread it is
        # never contended (its blocks hold no await).
        self._lock = threading.Lock()
        self._cond: asyncio.Condition | None = None
        self._task: asyncio.Task[None] | None = None
        self._locked_openings: asyncio.Semaphore | None = None

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def open(
        self, session: Any, send_action: Any, *, actor: Any, max_delay: Any
    ) -> TurnState:
        """Twin of :meth:`eventstore.engine.turns.TurnWriter.open`."""
        opening = prepare_opening(
            self.engine, session, send_action, actor=actor, max_delay=max_delay
        )
        state = claiming_turn(self.engine, opening)
        if state is not None:
            self._enlist(state)
            cond = self._condition()
            async with cond:
                cond.notify_all()
                try:
                    await self._wait(state, 0)
                finally:
                    if state.durable < 0:  # refused (or failed): not a turn
                        self._delist(state)
            if not state.refused:
                return state
        if self._locked_openings is None:
            self._locked_openings = asyncio.Semaphore(LOCKED_OPENINGS)
        async with self._locked_openings:
            state = await run(open_locked, self.engine, opening)
        self._enlist(state)
        return state

    def _enlist(self, state: TurnState) -> None:
        super()._enlist(state)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def add(
        self, state: TurnState, action: dict[str, Any], *, release: bool = False, native: Any = None
    ) -> Pending:
        """Twin of :meth:`eventstore.engine.turns.TurnWriter.add`."""
        encoded, native_bytes = self._encode(action, native)
        cond = self._condition()
        async with cond:
            while not state.over and state.buffered >= MAX_PENDING:
                await cond.wait()
            self._raise_if_over(state)
            first = not state.pending
            now = time.monotonic()
            p = state.add(action, encoded[0], encoded[1], now, native_bytes)
            state.release = state.release or release
            wait = state.must_wait(p, release, now)
            if wait or first:
                cond.notify_all()
            if wait:
                await self._wait(state, p.seq)
        return p

    async def flush(self, state: TurnState) -> int:
        """Twin of :meth:`eventstore.engine.turns.TurnWriter.flush`."""
        cond = self._condition()
        async with cond:
            if state.pending:
                state.wanted = state.last_seq
                cond.notify_all()
            await self._wait(state, state.last_seq)
            if not state.own_stop:
                self._raise_if_over(state, finished_ok=True)
            return state.row.head

    async def finish(self, state: TurnState, *, interrupted: bool) -> None:
        """Twin of :meth:`eventstore.engine.turns.TurnWriter.finish`."""
        cond = self._condition()
        try:
            if not state.over:
                try:
                    if interrupted:
                        await self.add(state, dict(INTERRUPTION), release=True)
                    else:
                        async with cond:
                            if not state.leave():
                                cond.notify_all()
                                await self._wait(state, state.last_seq, until_finished=True)
                except EventStoreError:
                    if not interrupted:
                        raise
            if state.leased and not state.finished:
                await run(release_lease, self.engine, state)
        finally:
            if state in self._turns:
                self._delist(state)

    async def _wait(self, state: TurnState, seq: int, *, until_finished: bool = False) -> None:
        cond = self._condition()
        while not state.over and (state.durable < seq or (until_finished and not state.finished)):
            await cond.wait()
        if state.durable < seq:
            self._raise_if_over(state)

    async def _run(self) -> None:
        cond = self._condition()
        while True:
            async with cond:
                while True:
                    now = time.monotonic()
                    due, wake = self._next_flush(now)
                    if wake is None:
                        break
                    try:
                        await asyncio.wait_for(cond.wait(), max(wake - now, 0.0005))
                    except asyncio.TimeoutError:
                        pass
                if not due and self._closing:
                    return
                work = self._work(due, now)
            try:
                await run(flush_turns, self.engine, self._lock, work, self._attempts)
            except Exception as exc:  # noqa: BLE001 - never leave a writer waiting forever
                err = flush_error(exc)
                for t, _, _ in work:
                    t.failed(err)
            async with cond:
                cond.notify_all()

    async def close(self) -> None:
        """Stop the flusher once every open turn's buffer is written."""
        self._closing = True
        if self._task is not None:
            cond = self._condition()
            async with cond:
                cond.notify_all()
            await self._task


class AsyncStreamingTurn(TurnView):
    """Twin of :class:`eventstore.StreamingTurn`: ``async with astore.turn(...) as turn``,
    ``await turn.write(part)``, ``await turn.flush()``, ``await turn.stop()``."""

    def __init__(
        self, writer: AsyncTurnWriter, session: Any, send_action: Any, *, actor: Any, max_delay: Any
    ) -> None:
        self._writer = writer
        self._args = (session, send_action, actor, max_delay)
        self._state = None

    _usage = "async with astore.turn(...) as turn:"

    async def __aenter__(self) -> AsyncStreamingTurn:
        session, send_action, actor, max_delay = self._args
        if self._state is not None:
            raise InvalidEvent("a turn can be entered only once")
        self._state = await self._writer.open(
            session, send_action, actor=actor, max_delay=max_delay
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._writer.finish(self._open(), interrupted=exc_type is not None)

    async def write(self, part: Mapping[str, Any] | Any, native: Any = None) -> None:
        """Twin of :meth:`eventstore.StreamingTurn.write` (``native``: the event's
        provider-native data)."""
        action = turn_action(part, self._writer.engine.validate.limits.max_event_bytes)
        await self._writer.add(self._open(), action, native=native)

    async def flush(self) -> int:
        """Twin of :meth:`eventstore.StreamingTurn.flush`."""
        return await self._writer.flush(self._open())

    async def stop(self) -> int:
        """Twin of :meth:`eventstore.StreamingTurn.stop`."""
        state = self._open()
        await self._writer.add(state, {"type": "stop"})
        return state.row.head
