"""Turns racing the calls that end a session: ``close_session`` and ``erase`` during a live
turn, with the turn really writing in another thread (or task)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from conftest import make_store
from eventstore import AsyncEventStore, EventStore, SessionClosed, SessionErased

SEND = {"type": "send", "id": "u-1", "text": "hi"}
DEADLINE = 30.0


def _wait_for(cond: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


class _Writer(threading.Thread):
    """A turn that writes deltas (and a tool call now and then) until something ends it."""

    def __init__(self, url: str, session: str) -> None:
        super().__init__(daemon=True)
        self.url, self.session = url, session
        self.error: BaseException | None = None
        self.writes = 0

    def run(self) -> None:
        with make_store(self.url) as store:
            try:
                with store.turn(self.session, SEND, max_delay=0.005) as turn:
                    turn.write({"type": "message-start", "messageId": "a-1"})
                    while True:
                        turn.write({"type": "text-delta", "messageId": "a-1", "text": "x"})
                        self.writes += 1
                        if self.writes % 50 == 0:
                            turn.flush()
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                self.error = exc


def _race(db_url: str, end: Callable[[EventStore], Any]) -> tuple[EventStore, BaseException | None]:
    store = make_store(db_url)
    store.append("bystander", [{"type": "stop"}])
    writer = _Writer(db_url, "s")
    writer.start()
    _wait_for(lambda: store.head("s") >= 20 if any(s.id == "s" for s in store.sessions()) else False, "the turn to write")
    end(store)
    writer.join(DEADLINE)
    assert not writer.is_alive(), "the turn never ended"
    return store, writer.error


def test_closing_a_session_ends_its_live_turn(db_url: str) -> None:
    store, error = _race(db_url, lambda s: s.close_session("s", reason="user left"))
    try:
        assert isinstance(error, SessionClosed), repr(error)
        state = store.load("s")
        assert state.status == "error"  # not left streaming: the close interrupted the turn
        last = list(store.history("s"))[-1]
        assert last.actor == "close" and last.type == "part"
        assert {s.id: s for s in store.sessions()}["s"].closed
        with pytest.raises(SessionClosed):
            store.recover("s", stale_after=0.001)  # closed, but nothing to recover either
    finally:
        store.close()


def test_erasing_a_session_during_its_live_turn_raises_session_erased(db_url: str) -> None:
    store, error = _race(db_url, lambda s: s.erase("s", reason="user request"))
    try:
        assert isinstance(error, SessionErased), repr(error)
        with pytest.raises(SessionErased):
            store.load("s")
        assert store.head("bystander") == 1
    finally:
        store.close()


def test_the_async_twin_closes_and_erases_a_live_turn(db_url: str) -> None:
    async def main() -> None:
        async with AsyncEventStore(db_url) as store:
            await store.migrate()
            for session, end in (
                ("c", lambda: store.close_session("c", reason="bye")),
                ("e", lambda: store.erase("e", reason="gone")),
            ):
                started = asyncio.Event()

                async def turn() -> BaseException | None:
                    try:
                        async with store.turn(session, SEND, max_delay=0.005) as t:
                            for i in range(1_000_000):
                                await t.write({"type": "text-delta", "messageId": "a-1", "text": "x"})
                                if i == 20:
                                    await t.flush()
                                    started.set()
                                await asyncio.sleep(0)
                    except (SessionClosed, SessionErased) as exc:
                        return exc
                    return None

                task = asyncio.create_task(turn())
                await asyncio.wait_for(started.wait(), DEADLINE)
                await end()
                error = await asyncio.wait_for(task, DEADLINE)
                assert isinstance(error, SessionClosed if session == "c" else SessionErased), repr(error)
            assert (await store.load("c")).status == "error"
            with pytest.raises(SessionErased):
                await store.load("e")

    asyncio.run(main())


@pytest.mark.twins
def test_recovery_status_says_why_not_and_when(store: Any) -> None:
    from datetime import datetime, timedelta, timezone

    from eventstore import RecoveryStatus

    store.append("s", [SEND, {"type": "part", "part": {"type": "message-start", "messageId": "a-1"}}])
    live = store.recovery_status("s", stale_after=3600)
    assert isinstance(live, RecoveryStatus) and (live.reason, live.status, live.recoverable) == ("writer-alive", "streaming", False)
    assert live.last_write is not None and live.recoverable_at == live.last_write + timedelta(seconds=3600)
    assert live.recoverable_at > datetime.now(timezone.utc)
    assert store.recover("s", stale_after=3600) is None  # recover's contract is unchanged
    _wait_for(lambda: store.recovery_status("s", stale_after=0.05).recoverable, "the writer to go stale")
    assert store.recovery_status("s", stale_after=0.05).to_json()["reason"] == "recoverable"
    assert store.recover("s", stale_after=0.05) is not None
    done = store.recovery_status("s", stale_after=0.05)
    assert (done.reason, done.status, done.recoverable_at) == ("not-streaming", "error", None)
    store.close_session("s")
    assert store.recovery_status("s").reason == "closed"


class _Hold:
    """Another connection holding what a flush needs: SQLite's write lock, or the
    session's row lock on PostgreSQL."""

    def __init__(self, db_url: str, session: str) -> None:
        from sqlalchemy import create_engine, text

        self.engine = create_engine(db_url)
        self.conn = self.engine.connect()
        if db_url.startswith("sqlite"):
            self.conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            self.conn.begin()
            self.conn.execute(text("SELECT pk FROM sessions WHERE id = :s FOR UPDATE"), {"s": session})

    def release(self) -> None:
        self.conn.rollback() if self.conn.in_transaction() else self.conn.exec_driver_sql("ROLLBACK")
        self.conn.close()
        self.engine.dispose()


class _Acknowledged(threading.Thread):
    """A turn writing deltas, noting when each write returned (sync or async twin)."""

    def __init__(self, db_url: str, twin: str) -> None:
        super().__init__(daemon=True)
        self.url, self.twin = db_url, twin
        self.returned: list[float] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if self.twin == "sync":
                with make_store(self.url) as store, store.turn("s", SEND, max_delay=0.05) as turn:
                    turn.write({"type": "message-start", "messageId": "a-1"})
                    while not self.stop.is_set():
                        turn.write({"type": "text-delta", "messageId": "a-1", "text": "x"})
                        self.returned.append(time.monotonic())
                        time.sleep(0.002)
                    turn.write({"type": "finish"})
            else:
                asyncio.run(self._async())
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            self.error = exc

    async def _async(self) -> None:
        async with AsyncEventStore(self.url) as store:
            async with store.turn("s", SEND, max_delay=0.05) as turn:
                await turn.write({"type": "message-start", "messageId": "a-1"})
                while not self.stop.is_set():
                    await turn.write({"type": "text-delta", "messageId": "a-1", "text": "x"})
                    self.returned.append(time.monotonic())
                    await asyncio.sleep(0.002)
                await turn.write({"type": "finish"})


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_write_stops_returning_while_the_database_takes_no_commit(db_url: str, twin: str) -> None:
    with make_store(db_url) as store:
        store.append("bystander", [{"type": "stop"}])
        writer = _Acknowledged(db_url, twin)
        writer.start()
        _wait_for(lambda: len(writer.returned) >= 20, "the turn to write")
        hold = _Hold(db_url, "s")
        held_at = time.monotonic()
        time.sleep(2.0)  # the stall being tested: 40 times max_delay
        released_at = time.monotonic()
        hold.release()
        _wait_for(lambda: any(t > released_at for t in writer.returned) or writer.error is not None, "writes to resume")
        writer.stop.set()
        writer.join(DEADLINE)
        assert not writer.is_alive()
        # No write was acknowledged while nothing could be made durable (a little after
        # the lock was taken, the writes already in flight may still return).
        during = [t for t in writer.returned if held_at + 0.3 < t < released_at - 0.05]
        assert during == [], f"{len(during)} writes returned during the stall"
        if writer.error is None:
            # Every acknowledged write is durable once the database takes commits again.
            deltas = [e for e in store.history("s") if e.action.get("part", {}).get("type") == "text-delta"]
            assert len(deltas) == len(writer.returned)
            assert store.load("s").status == "idle"
        else:
            from eventstore import StorageError

            assert isinstance(writer.error, StorageError), repr(writer.error)
