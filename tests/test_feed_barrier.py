"""PostgreSQL: the feed's barrier is held by the transactions that can still write events, and
by no one else.

A transaction id is assigned before its transaction commits, so the feed reads only below
the oldest transaction that could still add an event there. A stranger's transaction — in
another database of the cluster, under a role with no privilege at all, or in this database
on tables of its own — can never write an event, so it must not stop the feed: each test
holds one open and asserts that a new event still arrives within a deadline. The gap case
(an event writer that took its id first and commits last holds the feed back) is covered by
``tests/test_follow_feed.py``; here a held writer on this store's tables is checked once
more next to the strangers, on both twins.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from conftest import make_store, pg_admin_url
from sqlalchemy.engine import make_url

from eventstore import AsyncEventStore, EventStore, RecordedEvent

#: How long a new event may take to reach the feed with a stranger's transaction open
#: (the feed's own promise is 0.5 s after the commit; this only bounds a broken build).
DEADLINE = 10.0


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def other_database() -> Iterator[str]:
    """A database of its own on the same cluster, and a role with no privilege but LOGIN
    (and CONNECT, which every database grants PUBLIC); yields that role's DSN there."""
    admin_url = pg_admin_url()
    suffix = uuid.uuid4().hex[:10]
    db, role = f"stranger_{suffix}", f"stranger_{suffix}"
    admin = psycopg.connect(_dsn(admin_url), autocommit=True)
    admin.execute(f'CREATE DATABASE "{db}"')
    admin.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        yield make_url(_dsn(admin_url)).set(database=db, username=role, password=None).render_as_string(
            hide_password=False
        )
    finally:
        admin.execute(f'DROP DATABASE "{db}" WITH (FORCE)')
        admin.execute(f'DROP ROLE "{role}"')
        admin.close()


def _hold(dsn: str, *statements: str) -> psycopg.Connection[Any]:
    """A connection whose transaction ran ``statements``, took a transaction id and stays open."""
    conn = psycopg.connect(dsn)
    for sql in statements:
        conn.execute(sql)
    conn.execute("SELECT pg_current_xact_id()")
    return conn


def _strangers(pg_schema: str, other_database: str) -> list[psycopg.Connection[Any]]:
    """Three transactions that can never write an event, held open: a zero-privilege role in
    another database, an idle one in this database, and one writing a table of its own here."""
    here = _dsn(pg_schema)
    return [
        _hold(other_database),
        _hold(here),
        _hold(here, "CREATE TABLE IF NOT EXISTS unrelated (x int)", "INSERT INTO unrelated VALUES (1)"),
    ]


def _next_event(follower: Any) -> RecordedEvent | None:
    """The follower's next event, read in a thread so that the test can bound the wait."""
    got: list[RecordedEvent] = []
    reader = threading.Thread(target=lambda: got.extend([next(follower)]), daemon=True)
    reader.start()
    reader.join(DEADLINE)
    if reader.is_alive():
        follower.close()
        reader.join(DEADLINE)
        return None
    return got[0] if got else None


def test_a_strangers_open_transaction_does_not_hold_the_feed(pg_schema: str, other_database: str) -> None:
    store: EventStore = make_store(pg_schema)
    try:
        store.append("s1", [{"type": "send", "id": "u-0", "text": "before"}])
        position = list(store.feed(idle_timeout=0))[-1].position
        held = _strangers(pg_schema, other_database)
        try:
            store.append("s1", [{"type": "send", "id": "u-1", "text": "after"}])
            assert [(e.session_id, e.version) for e in store.feed(after=position, idle_timeout=0)] == [("s1", 2)]
            # A follower waiting when the event is written gets it too.
            follower = store.feed(after=list(store.feed(idle_timeout=0))[-1].position, idle_timeout=DEADLINE)
            store.append("s2", [{"type": "send", "id": "u-2", "text": "live"}])
            ev = _next_event(follower)
            assert ev is not None and (ev.session_id, ev.version) == ("s2", 1)
            follower.close()
        finally:
            for conn in held:
                conn.close()
    finally:
        store.close()


def test_a_held_event_writer_still_holds_the_feed_next_to_strangers(pg_schema: str, other_database: str) -> None:
    """An open transaction that took its id while it can write events (it holds a lock on the
    events table, as every writer does) is waited for; the strangers are not."""
    store: EventStore = make_store(pg_schema)
    try:
        store.append("held", [{"type": "send", "id": "u-0", "text": "first"}])
        position = list(store.feed(idle_timeout=0))[-1].position
        held = _strangers(pg_schema, other_database)
        writer = _hold(_dsn(pg_schema), "LOCK TABLE events IN ROW EXCLUSIVE MODE")
        try:
            store.append("later", [{"type": "send", "id": "u-1", "text": "later"}])
            probe = store.feed(after=position, idle_timeout=0)
            assert list(probe) == [] and not probe.caught_up  # waiting behind the writer only
            writer.execute(
                "INSERT INTO events (session_pk, version, type, turn, payload, recorded_at, hash) "
                "SELECT pk, 2, 'stop', 0, '{\"type\":\"stop\"}'::bytea, 0, '\\x00'::bytea "
                "FROM sessions WHERE id = 'held'"
            )
            writer.execute("UPDATE sessions SET head = 2 WHERE id = 'held'")
            writer.commit()
            got = [(e.session_id, e.version) for e in store.feed(after=position, idle_timeout=0)]
            assert got == [("held", 2), ("later", 1)]  # the writer's older id comes first
        finally:
            writer.close()
            for conn in held:
                conn.close()
    finally:
        store.close()


def test_a_strangers_open_transaction_does_not_hold_the_async_feed(pg_schema: str, other_database: str) -> None:
    make_store(pg_schema).close()

    async def main() -> None:
        async with AsyncEventStore(pg_schema) as astore:
            await astore.append("s1", [{"type": "send", "id": "u-0", "text": "before"}])
            position = [e async for e in astore.feed(idle_timeout=0)][-1].position
            held = _strangers(pg_schema, other_database)
            try:
                waiting = astore.feed(after=position, idle_timeout=DEADLINE)
                first = asyncio.ensure_future(waiting.__anext__())
                await asyncio.sleep(0)
                await astore.append("s1", [{"type": "send", "id": "u-1", "text": "after"}])
                ev = await asyncio.wait_for(first, DEADLINE)
                assert (ev.session_id, ev.version) == ("s1", 2)
                await waiting.aclose()
            finally:
                for conn in held:
                    conn.close()

    asyncio.run(main())
