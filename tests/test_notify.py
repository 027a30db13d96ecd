"""Wake-ups sent after the commit: the notifier coalesces, flushes on close, retries, and
every write path of a store wakes the followers of other processes.

On PostgreSQL no writing transaction notifies (that would serialise the commits of every
writer); the store sends one ``pg_notify`` of its own once its writes have committed. A
plain ``LISTEN`` connection stands for the other process here.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg

from conftest import make_store, wait_until
from eventstore import AsyncEventStore, EventStore
from eventstore.storage.postgres import feed_channel
from eventstore.storage.watch import Notifier, Signal

SAFETY = 30.0


class _Gated(Signal):
    """A signal whose signs complete only once released, recording every one."""

    def __init__(self, failures: int = 0) -> None:
        self.started = 0
        self.connects = 0
        self.failures = failures
        self.waiting = threading.Semaphore(0)
        self.release = threading.Event()
        self.release.set()

    def connect(self) -> Any:
        self.connects += 1
        return object()

    def start(self, handle: Any) -> None:
        self.started += 1

    def finish(self, handle: Any, timeout: float) -> bool:
        self.waiting.release()
        assert self.release.wait(SAFETY)
        if self.failures:
            self.failures -= 1
            raise ConnectionError("lost")
        return True

    def close(self, handle: Any) -> None:
        pass


def test_marks_made_while_a_sign_is_in_flight_are_coalesced_into_one() -> None:
    signal = _Gated()
    signal.release.clear()
    notifier = Notifier(signal, name="test-notify")
    notifier.mark()
    assert signal.waiting.acquire(timeout=SAFETY)  # the first sign is in flight
    for _ in range(100):
        notifier.mark()
    signal.release.set()
    notifier.close()  # sends what is still due
    assert signal.started == 2
    notifier.mark()  # ignored once closed
    assert signal.started == 2


def test_commits_soon_after_a_sign_wait_for_the_spacing_and_share_one_sign() -> None:
    signal = _Gated()
    notifier = Notifier(signal, name="test-notify", spacing=0.3)
    # Before the mark: the spacing runs from the first sign's start, inside mark().
    first = time.monotonic()
    notifier.mark()
    assert signal.started == 1  # sent at once, by the writer's own thread
    for _ in range(50):
        notifier.mark()  # a busy writer: its commits share the next sign
    assert signal.started == 1
    wait_until(lambda: signal.started == 2, "the sign of the commits after the first")
    assert time.monotonic() - first >= 0.3
    notifier.close()
    assert signal.started == 2


def test_a_failed_sign_is_sent_again_on_a_new_connection() -> None:
    signal = _Gated(failures=1)
    notifier = Notifier(signal, name="test-notify")
    notifier.mark()
    assert signal.waiting.acquire(timeout=SAFETY)  # the failing sign
    assert signal.waiting.acquire(timeout=SAFETY)  # the one sent again
    notifier.close()
    assert (signal.started, signal.connects) == (2, 2)


def _listen(url: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1), autocommit=True)
    channel = conn.execute(feed_channel()).fetchone()
    assert channel is not None and channel[0] is not None
    conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel[0])))
    return conn


def _woken(conn: psycopg.Connection[Any]) -> int:
    """Wait for one notification (and take only that one)."""
    return sum(1 for _ in conn.notifies(timeout=SAFETY, stop_after=1))


def _sent(conn: psycopg.Connection[Any]) -> int:
    """The notifications not taken yet, once the stores that sent them are closed (closing
    sends the signs still due): a notification of the test's own, sent now, comes after
    every one of them and ends the count."""
    with psycopg.connect(conn.info.dsn, autocommit=True) as other:
        other.execute("SELECT pg_notify((%s), 'end')", (conn.execute(feed_channel()).fetchone()[0],))  # type: ignore[index]
    n = 0
    for note in conn.notifies(timeout=SAFETY):
        if note.payload == "end":
            return n
        n += 1
    raise AssertionError("the test's own notification never came")


def _send(i: int) -> dict[str, Any]:
    return {"type": "send", "id": f"u-{i}", "text": "hi"}


def test_every_write_path_wakes_other_processes_after_its_commit(pg_schema: str) -> None:
    make_store(pg_schema).close()
    listener = _listen(pg_schema)
    try:
        # A store of its own for each write path: once it is closed, its signs are all sent.
        with EventStore(pg_schema) as store:
            store.append("s1", [_send(1)])  # one event: the one-statement path
        assert _sent(listener) == 1
        with EventStore(pg_schema) as store:
            store.append("s1", [_send(2), _send(3)])  # several: the batch statement
        assert _sent(listener) == 1
        with EventStore(pg_schema) as store:
            store.append("s1", [_send(4)], metadata={"k": "v"})
        assert _sent(listener) >= 1
        with EventStore(pg_schema) as store:
            store.branch("s1", at=2, new_id="b1")  # a write transaction
        assert _sent(listener) >= 1
        with EventStore(pg_schema) as store:
            with store.turn("s2", _send(5)) as turn:  # group commits of a streaming turn
                assert _woken(listener) == 1  # the send's, while the turn goes on
                turn.write({"type": "message-start", "messageId": "a-1"})
                turn.write({"type": "finish"})
        assert _sent(listener) >= 1
    finally:
        listener.close()


def test_the_async_store_wakes_other_processes_after_its_commits(pg_schema: str) -> None:
    make_store(pg_schema).close()
    listener = _listen(pg_schema)

    async def main() -> None:
        async with AsyncEventStore(pg_schema) as astore:
            await asyncio.gather(*(astore.append(f"s{i}", [_send(i)]) for i in range(8)))

    try:
        asyncio.run(main())  # closing the store sends what is still marked
        assert _sent(listener) >= 1
    finally:
        listener.close()


def test_a_follower_in_another_store_is_woken_by_a_commit(db_url: str) -> None:
    with make_store(db_url) as writer, make_store(db_url) as reader:
        writer.append("s1", [_send(0)])
        follower = reader.follow("s1", after=1, idle_timeout=SAFETY)
        writer.append("s1", [_send(1)])
        assert next(follower).version == 2
        follower.close()
