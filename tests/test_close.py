"""Closing a store ends what it runs: no follower reads on, no statement outlives close().

A test's schema is dropped right after its store closes; a follower thread still reading
then deadlocks the ``DROP SCHEMA`` (it holds the table and waits for an index the drop
holds).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from conftest import _psycopg_dsn, await_until, make_store, pg_admin_url, wait_until

from eventstore import AsyncEventStore, EventStore


def _send(store: EventStore, session: str, text: str) -> int:
    return store.append(session, [{"type": "send", "id": f"u-{uuid.uuid4().hex[:8]}", "text": text}]).version


def _following(store: EventStore, session: str, after: int) -> tuple[threading.Thread, list[Any]]:
    """A thread following ``session`` with no idle timeout; what it got (or raised)."""
    got: list[Any] = []
    follower = store.follow(session, after=after)

    def run() -> None:
        try:
            got.extend(follower)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            got.append(exc)

    thread = threading.Thread(target=run, name="test-follower", daemon=True)
    thread.start()
    return thread, got


def test_close_ends_a_follower_waiting_for_events(db_url: str) -> None:
    store = make_store(db_url)
    head = _send(store, "s", "one")
    thread, got = _following(store, "s", head - 1)
    wait_until(lambda: len(got) == 1, "the follower's first event")
    store.close()
    # Before: the follower read on over a fresh pool, forever (no idle timeout).
    wait_until(lambda: not thread.is_alive(), "the follower's end after close()", timeout=10)
    assert [e.version for e in got] == [head]


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_close_waits_for_a_followers_statement(db_url: str) -> None:
    """A follower's read still running when close() is called is over when it returns."""
    store, app = _named_store(db_url)
    head = _send(store, "s", "one")
    thread, _ = _following(store, "s", head)
    with _admin(db_url) as admin:
        # The follower's next (safety-poll) read is held inside the server by the lock.
        _lock_and_wait_for_a_read(admin, app)
        _close_must_wait(store, admin, app)
    wait_until(lambda: not thread.is_alive(), "the follower's end after close()", timeout=10)


def _named_store(db_url: str) -> tuple[EventStore, str]:
    """A store whose connections carry an application name of their own; that name."""
    app = f"close-{uuid.uuid4().hex[:12]}"
    # No background sealer: the read a test waits for is the follower's, not a seal's.
    return make_store(f"{db_url}&application_name={app}", seal=False), app


@contextmanager
def _admin(db_url: str) -> Iterator[Any]:
    """A connection of the test's own on the store's schema (not autocommit)."""
    import psycopg

    with psycopg.connect(_psycopg_dsn(db_url)) as admin:
        yield admin


def _lock_and_wait_for_a_read(admin: Any, app: str) -> None:
    """Lock the events table on ``admin`` (in its open transaction) and wait until a
    connection named ``app`` waits for the lock: a read running, held inside the server
    (not the notifier's index summary, which gives up on a lock at once)."""
    import psycopg

    admin.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")

    def blocked() -> bool:
        with psycopg.connect(_psycopg_dsn(pg_admin_url()), autocommit=True) as probe:
            row = probe.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                " AND wait_event_type = 'Lock' AND query NOT LIKE '%%eventstore summarize%%'",
                (app,),
            ).fetchone()
        return bool(row and row[0])

    wait_until(blocked, "a read waiting for the lock")



def _statements_running(app: str) -> int:
    import psycopg

    with psycopg.connect(_psycopg_dsn(pg_admin_url()), autocommit=True) as probe:
        row = probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND state <> 'idle'", (app,)
        ).fetchone()
    return int(row[0]) if row else 0


def _close_must_wait(store: EventStore, admin: Any, app: str) -> None:
    """Call ``store.close()`` while ``admin`` holds the lock a read waits for: it must not
    return before the read ends (the lock released); then no statement of ``app`` runs."""
    closer = threading.Thread(target=store.close, name="test-close", daemon=True)
    closer.start()
    closer.join(0.5)
    try:
        # Before: close() returned at once, the read still running (and a DROP SCHEMA
        # right after it deadlocked with the read).
        assert closer.is_alive(), "close() returned while a read ran"
    finally:
        admin.rollback()
    wait_until(lambda: not closer.is_alive(), "close() after the read ended")
    assert _statements_running(app) == 0

@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_close_ends_an_abandoned_explorer_stream(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page's live stream cut by the client leaves its follower in a worker thread of the
    server; closing the store after the server stopped ends it, its read included."""
    import httpx
    from explorer_server import running

    import eventstore.explorer.app as explorer_app

    # The stream's follower would give up within a second; widen the window it reads on.
    monkeypatch.setattr(explorer_app, "_IDLE", 3600.0)
    store, app = _named_store(db_url)
    head = _send(store, "s", "one")
    with _admin(db_url) as admin:
        with running(store) as base, httpx.Client(base_url=base, timeout=10) as http:
            with http.stream("GET", "/sessions/s/events", params={"after": head}) as r:
                lines = r.iter_lines()
                assert next(lines).startswith("retry:")
                # An event through the stream: its follower is live, waiting for the next.
                _send(store, "s", "two")
                assert any(line.startswith("data:") for line in lines)
                # Its next safety-poll read is held by the lock before the page goes, so
                # the server's worker thread is inside the follower when the stream is cut
                # (cut earlier, the server may never ask the follower again: nothing to end).
                _lock_and_wait_for_a_read(admin, app)
        _close_must_wait(store, admin, app)


def test_async_close_ends_a_follower_waiting_for_events(db_url: str) -> None:
    """The async twin: a follower iterated by another task ends with ``close()``."""

    async def scenario() -> None:
        store = AsyncEventStore(db_url)
        await store.migrate()
        head = (await store.append("s", [{"type": "send", "id": "u-1", "text": "one"}])).version
        got: list[Any] = []

        async def consume() -> None:
            async for ev in store.follow("s", after=head - 1):
                got.append(ev)

        task = asyncio.create_task(consume())
        await await_until(lambda: got, "the follower's first event")
        await store.close()
        # Before: the follower read on over a fresh pool, forever (no idle timeout).
        await asyncio.wait_for(task, 10)
        assert [e.version for e in got] == [head]

    asyncio.run(scenario())


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_async_close_waits_for_a_followers_statement(db_url: str) -> None:
    """The async twin: a follower's read running when close() is called is over when it returns."""

    async def scenario() -> None:
        app = f"close-{uuid.uuid4().hex[:12]}"
        store = AsyncEventStore(f"{db_url}&application_name={app}")
        await store.migrate()
        head = (await store.append("s", [{"type": "send", "id": "u-1", "text": "one"}])).version

        async def consume() -> None:
            async for _ in store.follow("s", after=head):
                pass

        task = asyncio.create_task(consume())
        with _admin(db_url) as admin:
            await asyncio.to_thread(_lock_and_wait_for_a_read, admin, app)
            closer = asyncio.create_task(store.close())
            done, _ = await asyncio.wait({closer}, timeout=0.5)
            try:
                assert not done, "close() returned while a read ran"
            finally:
                admin.rollback()
            await asyncio.wait_for(closer, 60)
        assert await asyncio.to_thread(_statements_running, app) == 0
        await asyncio.wait_for(task, 10)

    asyncio.run(scenario())
