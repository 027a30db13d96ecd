"""Live follow and the global feed: exactly once, in order, never past an open transaction.

What must hold, on both backends:

- ``follow`` yields a session's events after a version in order, then each new one once,
  and stops after ``idle_timeout`` without one;
- ``feed`` yields every stored event exactly once under 8 concurrent writers (some of them
  sharing sessions), each session's in version order, and resumes right after a stored
  position — also after a compaction deleted the event the position names;
- the gap case: a writer's transaction that took its id first and commits last. The feed
  must not move past it while it is open, and must deliver its event when it commits
  (PostgreSQL: forced with a raw transaction held open; SQLite: a write transaction held
  open, which blocks the others);
- PostgreSQL: a follower survives a server restart in the middle of the writes.

No test sleeps and hopes: consumers stop when they have what the database holds, and
``idle_timeout`` only bounds how long a broken build would wait.
"""

from __future__ import annotations

import asyncio
import logging
import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text

from cli_helpers import run_cli
from conftest import await_until, make_store, wait_until
from eventstore import AsyncEventStore, EventStore, Follower, InvalidEvent, RecordedEvent, SessionNotFound, VersionNotFound
from eventstore.errors import StorageError
from eventstore.core.feed_rules import BAND_PAGE
from test_replicas import _replicated, _sql, _wait_until_paused, replica_url  # noqa: F401 - a fixture
from test_restart import PrivateCluster

SAFETY = 60.0  # only bounds a broken build's wait; never reached when things work


def _send(i: int) -> dict[str, Any]:
    return {"type": "send", "id": f"u-{i}", "text": f"message {i}"}


def _stored(engine: Engine) -> list[tuple[str, int]]:
    """Every (session, version) the database holds: rows of events, and sealed segments."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT s.id, e.version FROM events e JOIN sessions s ON s.pk = e.session_pk")
        ).all()
        sealed = conn.execute(
            text(
                "SELECT s.id, g.first_version, g.last_version FROM event_segments g "
                "JOIN sessions s ON s.pk = g.session_pk"
            )
        ).all()
    # Rows first, then segments: a background seal between the two reads moves events from
    # the first to the second, so they are read twice (once each), never missed.
    out = {(str(a), int(b)) for a, b in rows}
    out |= {(str(a), v) for a, lo, hi in sealed for v in range(int(lo), int(hi) + 1)}
    return sorted(out)


def _check_feed(got: list[RecordedEvent], stored: list[tuple[str, int]]) -> None:
    """Exactly the stored set, no duplicates, each session in version order, positions rising."""
    keys = [(e.session_id, e.version) for e in got]
    assert len(keys) == len(set(keys)), "an event was yielded twice"
    assert sorted(keys) == stored
    per: dict[str, list[int]] = defaultdict(list)
    for s, v in keys:
        per[s].append(v)
    for s, versions in per.items():
        assert versions == sorted(versions), f"session {s} out of order: {versions}"
    positions = [e.position for e in got]
    assert all(p is not None for p in positions)
    assert positions == sorted(positions)  # type: ignore[type-var]


class Consumer:
    """Reads a follower in a thread until it has ``want`` events (or the follower ends)."""

    def __init__(self, follower: Follower) -> None:
        self.follower = follower
        self.got: list[RecordedEvent] = []
        self.want: int | None = None
        self.errors: list[BaseException] = []
        self._more = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for ev in self.follower:
                with self._more:
                    self.got.append(ev)
                    self._more.notify_all()
                    if self.want is not None and len(self.got) >= self.want:
                        break
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)
        finally:
            with self._more:
                self._more.notify_all()

    def wait_until(self, n: int) -> None:
        """Block until ``n`` events arrived (reading goes on)."""
        with self._more:
            self._more.wait_for(lambda: len(self.got) >= n or not self.thread.is_alive(), timeout=SAFETY)
        assert len(self.got) >= n, (self.got, self.errors)

    def wait_for(self, n: int) -> list[RecordedEvent]:
        """Block until ``n`` events arrived; stop reading there."""
        with self._more:
            self.want = n
            self._more.wait_for(lambda: len(self.got) >= n or not self.thread.is_alive(), timeout=SAFETY)
        self.follower.close()  # from this thread: the reader wakes up and stops
        self.thread.join(SAFETY)
        assert not self.thread.is_alive()
        assert not self.errors, self.errors
        return list(self.got)


def _writers(
    store: EventStore, n: int, batches: int, *, retry: bool = False, tag: str = "w"
) -> list[threading.Thread]:
    """``n`` writers: each appends ``batches`` batches of 1-3 events alternately to its own
    session and to one of two shared sessions (retrying retryable errors with the same ids)."""
    failures: list[BaseException] = []

    def write(w: int) -> None:
        try:
            for b in range(batches):
                session = f"own-{w}" if b % 2 == 0 else f"shared-{w % 2}"
                size = 1 + (w + b) % 3
                ids = [f"{tag}{w}-b{b}-{k}" for k in range(size)]
                while True:
                    try:
                        store.append(session, [_send(k) for k in range(size)], event_ids=ids)
                        break
                    except StorageError as exc:
                        if not (retry and exc.retryable):
                            raise
                        threading.Event().wait(0.05)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(w,), daemon=True) for w in range(n)]
    for t in threads:
        t.start()
    threads.append(threading.Thread(target=lambda: None))  # a carrier for the failures
    threads[-1].failures = failures  # type: ignore[attr-defined]
    return threads


def _join(threads: list[threading.Thread]) -> None:
    for t in threads[:-1]:
        t.join(SAFETY)
        assert not t.is_alive()
    assert not threads[-1].failures, threads[-1].failures  # type: ignore[attr-defined]


# -- follow ---------------------------------------------------------------------------------


def test_follow_yields_the_past_then_each_new_event_once(store: EventStore) -> None:
    store.append("s1", [_send(i) for i in range(3)])
    follower = store.follow("s1", after=1, idle_timeout=SAFETY)
    consumer = Consumer(follower)
    for i in range(3, 9):
        store.append("s1", [_send(i)])
    got = consumer.wait_for(8)
    assert [e.version for e in got] == list(range(2, 10))
    assert all(e.session_id == "s1" and e.position is None for e in got)
    assert follower.version == 9 and follower.position is None


def test_follow_stops_after_the_idle_timeout_and_reports_no_lag_when_caught_up(store: EventStore) -> None:
    store.append("s1", [_send(0), _send(1)])
    follower = store.follow("s1", idle_timeout=0)
    assert [e.version for e in follower] == [1, 2]
    assert follower.caught_up and follower.lag == 0.0
    assert list(store.follow("s1", after=2, idle_timeout=0)) == []


def test_follow_of_a_branch_includes_its_inherited_prefix(store: EventStore) -> None:
    store.append("p", [_send(i) for i in range(4)])
    store.branch("p", at=2, new_id="b")
    store.append("b", [{"type": "stop"}])
    store.append("p", [{"type": "stop"}])  # the parent's later events are not the branch's
    got = [(e.session_id, e.version) for e in store.follow("b", idle_timeout=0)]
    assert got == [("p", 1), ("p", 2), ("b", 3)]


def test_follow_and_feed_refuse_bad_arguments(store: EventStore) -> None:
    store.append("s1", [_send(0)])
    with pytest.raises(SessionNotFound):
        store.follow("nope")
    with pytest.raises(VersionNotFound):
        store.follow("s1", after=2)
    for bad in (-1, "1", 1.5, True):
        with pytest.raises(InvalidEvent):
            store.follow("s1", after=bad)  # type: ignore[arg-type]
    for bad_timeout in (-1, "1", True, float("nan"), float("inf")):
        with pytest.raises(InvalidEvent):
            store.follow("s1", idle_timeout=bad_timeout)  # type: ignore[arg-type]
        with pytest.raises(InvalidEvent):
            store.feed(idle_timeout=bad_timeout)  # type: ignore[arg-type]
    for bad_position in ("", "12", "0000000000000001.00000001", "zz" * 17, 5, b"x"):
        with pytest.raises(InvalidEvent):
            store.feed(after=bad_position)  # type: ignore[arg-type]


# -- feed -----------------------------------------------------------------------------------


def test_feed_under_8_concurrent_writers_is_exact_and_in_session_order(
    store: EventStore, raw_engine: Engine
) -> None:
    feed = Consumer(store.feed(idle_timeout=SAFETY))
    store.append("shared-0", [_send(0)])
    follow = Consumer(store.follow("shared-0", idle_timeout=SAFETY))
    threads = _writers(store, 8, 12)
    _join(threads)
    stored = _stored(raw_engine)
    _check_feed(feed.wait_for(len(stored)), stored)
    head = store.head("shared-0")
    assert [e.version for e in follow.wait_for(head)] == list(range(1, head + 1))
    # A second reader from the start agrees, and so does one resumed from the middle.
    again = list(store.feed(idle_timeout=0))
    assert [e.position for e in again] == [e.position for e in feed.got]
    middle = again[len(again) // 2].position
    assert list(store.feed(after=middle, idle_timeout=0)) == again[len(again) // 2 + 1 :]


def test_feed_of_group_committed_streaming_turns_is_exact_and_in_session_order(
    store: EventStore, raw_engine: Engine
) -> None:
    # Streaming turns commit many sessions in one transaction (group commit), next to plain
    # appends: every event still comes once, each session's in version order.
    feed = Consumer(store.feed(idle_timeout=SAFETY))
    failures: list[BaseException] = []

    def stream(w: int) -> None:
        try:
            for t in range(3):
                with store.turn(f"turn-{w}", _send(t), max_delay=0.005) as turn:
                    turn.write({"type": "message-start", "messageId": f"a-{w}-{t}"})
                    for k in range(20):
                        turn.write({"type": "text-delta", "messageId": f"a-{w}-{t}", "text": f"{k} "})
                    turn.write({"type": "finish", "reason": "stop"})
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    threads = [threading.Thread(target=stream, args=(w,), daemon=True) for w in range(6)]
    for t in threads:
        t.start()
    _join(_writers(store, 2, 6, tag="plain"))
    for t in threads:
        t.join(SAFETY)
        assert not t.is_alive()
    assert not failures, failures
    stored = _stored(raw_engine)
    _check_feed(feed.wait_for(len(stored)), stored)


def test_feed_resumes_from_a_stored_position_in_a_new_store(db_url: str) -> None:
    with make_store(db_url) as first:
        first.append("a", [_send(0), _send(1)])
        first.append("b", [_send(0)])
        seen = list(first.feed(idle_timeout=0))
        position = seen[-1].position
    with EventStore(db_url) as second:
        second.append("a", [_send(2)])
        rest = list(second.feed(after=position, idle_timeout=0))
    assert [(e.session_id, e.version) for e in rest] == [("a", 3)]
    assert rest[0].position is not None and rest[0].position > position  # type: ignore[operator]


def test_a_position_naming_a_compacted_event_still_resumes_right_after_it(store: EventStore) -> None:
    store.append("a", [_send(0), _send(1), _send(2)])
    position = list(store.feed(idle_timeout=0))[-1].position
    store.compact("a", upto=3)  # deletes every event of the store, the newest included
    store.append("b", [_send(0)])
    got = list(store.feed(after=position, idle_timeout=0))
    assert [(e.session_id, e.version) for e in got] == [("b", 1)]
    # From the start, the compacted events are simply not there.
    assert [(e.session_id, e.version) for e in store.feed(idle_timeout=0)] == [("b", 1)]


def _burn_transaction_ids(db_url: str, n: int) -> None:
    """PostgreSQL: let ``n`` transactions take an id and write no event (a long stretch of
    ids the feed must cross); nothing to do on SQLite, whose numbers have no such gaps."""
    if not db_url.startswith("postgresql"):
        return
    with psycopg.connect(_pg_dsn(db_url), autocommit=True) as conn:
        conn.execute(
            f"DO $$ BEGIN FOR i IN 1..{int(n)} LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$"
        )


def test_feed_crosses_a_transaction_larger_than_a_page_and_stretches_without_events(
    store: EventStore, db_url: str, raw_engine: Engine
) -> None:
    store.append("a", [_send(0)])
    _burn_transaction_ids(db_url, 5000)  # wider than the first band, several times over
    big = BAND_PAGE * 5 // 2  # one transaction, 2.5 pages
    store.append("big", [_send(i) for i in range(big)])
    _burn_transaction_ids(db_url, 300)
    store.append("a", [_send(1)])
    got = list(store.feed(idle_timeout=0))
    stored = _stored(raw_engine)
    _check_feed(got, stored)
    # Resumed from inside the big transaction: exactly the rest.
    middle = BAND_PAGE + 200
    rest = list(store.feed(after=got[middle].position, idle_timeout=0))
    assert [(e.session_id, e.version) for e in rest] == [(e.session_id, e.version) for e in got[middle + 1:]]


def test_bands_hand_out_every_row_once_in_order() -> None:
    """The band sizing alone, on a made-up table: dense and sparse stretches of ids, a
    transaction of many rows, ids that wrote nothing; read below a barrier."""
    import random

    from eventstore.core.feed_rules import Bands, FeedKey
    from eventstore.core.rows import FeedRow

    rnd = random.Random(7)
    xacts = [rnd.randrange(10**6) for _ in range(3000)] + [500_000] * (BAND_PAGE * 5 // 2) + list(range(10, 40))
    table = sorted(
        FeedRow(rnd.randrange(1, 50), i, None, "stop", 0, b"{}", 0, None, None, b"", x, "s")
        for i, x in enumerate(xacts)
    )
    table.sort(key=lambda r: (r.xact, r.session_pk, r.version))
    below = 900_000
    bands, key, got, reads, limits = Bands(), None, [], 0, set()
    more = True
    while more:
        upto = bands.upto(key, below)
        after = (-1, 0, 0) if key is None else key.as_tuple()
        limits.add(bands.limit)
        page = [r for r in table if (r.xact, r.session_pk, r.version) > after and r.xact <= upto][: bands.limit]
        got += page
        key, more, bands = bands.read(key, page, upto, below)
        reads += 1
    assert got == [r for r in table if r.xact < below]
    assert reads < 60
    assert max(limits) > min(limits)  # the pages of the big transaction grew


def test_imported_sessions_appear_in_the_feed(store: EventStore, tmp_path: Any) -> None:
    path = tmp_path / "a.jsonl"
    with make_store(f"sqlite:///{tmp_path / 'source.db'}") as source:
        source.append("a", [_send(0), _send(1)])
        source.export("a", path)
    store.append("z", [_send(0)])
    position = list(store.feed(idle_timeout=0))[-1].position
    store.import_(path.read_text().splitlines())
    got = [(e.session_id, e.version) for e in store.feed(after=position, idle_timeout=0)]
    assert got == [("a", 1), ("a", 2)]


@pytest.mark.migrations  # downgrades and upgrades: Alembic's own schema
def test_events_recorded_before_the_feed_revision_come_first_in_session_order(
    db_url: str, raw_engine: Engine
) -> None:
    from alembic import command

    from eventstore.storage.migrate import alembic_config

    with make_store(db_url) as store:
        store.append("b", [_send(0), _send(1)])
        store.append("a", [_send(0)])
        store.append("b", [_send(2)])
    with raw_engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0002")
    with make_store(db_url) as store:  # upgrade again: the backfill
        store.append("c", [_send(0)])
        got = [(e.session_id, e.version) for e in store.feed(idle_timeout=0)]
    assert got[-1] == ("c", 1)
    assert sorted(got[:-1]) == [("a", 1), ("b", 1), ("b", 2), ("b", 3)]
    assert [v for s, v in got if s == "b"] == [1, 2, 3]


# -- the gap case ----------------------------------------------------------------------------


def _hold_oldest_transaction(dsn: str) -> tuple[psycopg.Connection[Any], int]:
    """Open an event writer's transaction that takes its id now, before anyone else's, and
    hold it. Like every writer of the store it touches the events table before it takes
    its id (a transaction holding no lock on it cannot write an event and does not hold
    the feed, see tests/test_feed_barrier.py).

    Returns the connection (its transaction open) and the transaction id.
    """
    conn = psycopg.connect(dsn)
    conn.execute("LOCK TABLE events IN ROW EXCLUSIVE MODE")
    xid = int(conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0])  # type: ignore[index]
    return conn, xid


def _raw_insert(conn: psycopg.Connection[Any], session: str, version: int) -> None:
    """Insert one event the way any writer would (the column default gives its xact)."""
    conn.execute(
        "INSERT INTO events (session_pk, version, type, turn, payload, recorded_at, hash) "
        "SELECT pk, %s, 'stop', 0, '{\"type\":\"stop\"}'::bytea, 0, '\\x00'::bytea FROM sessions WHERE id = %s",
        (version, session),
    )
    conn.execute("UPDATE sessions SET head = %s WHERE id = %s", (version, session))


def _pg_dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def test_postgresql_gap_a_held_transaction_holds_the_feed_and_is_delivered_across_a_restart() -> None:
    cluster = PrivateCluster()
    try:
        url = cluster.url()
        store = make_store(url)
        raw = create_engine(url)
        try:
            store.append("held", [_send(0)])
            feed = Consumer(store.feed(idle_timeout=SAFETY))

            # Phase 1: writers with a server restart in the middle; the feed follows across it.
            threads = _writers(store, 8, 6, retry=True)
            cluster.restart()
            _join(threads)
            _join(_writers(store, 8, 2, retry=True, tag="after-restart"))
            before = _stored(raw)
            _check_feed(feed.wait_for(len(before)), before)
            position = feed.got[-1].position

            # Phase 2: the gap. `held` takes the oldest transaction id and stays open while
            # eight writers commit with later ids.
            conn, xid = _hold_oldest_transaction(_pg_dsn(url))
            try:
                _join(_writers(store, 8, 4, tag="gap"))
                assert len(_stored(raw)) > len(before)
                late = list(store.feed(after=position, idle_timeout=0))
                assert late == []  # every one of them waits behind the held transaction
                probe = store.feed(after=position, idle_timeout=0)
                assert list(probe) == [] and not probe.caught_up  # committed events are pending
                _raw_insert(conn, "held", 2)
                conn.commit()
            finally:
                conn.close()
            after = list(store.feed(after=position, idle_timeout=0))
            stored = _stored(raw)
            _check_feed(feed.got + after, stored)
            held = [e for e in after if e.session_id == "held"]
            assert [e.version for e in held] == [2]
            assert int(held[0].position.split(".")[0], 16) == xid  # type: ignore[union-attr]
            assert after[0] == held[0]  # the oldest transaction comes first
        finally:
            store.close()
            raw.dispose()
    finally:
        cluster.close()


def test_a_page_whose_read_transaction_fails_before_it_ends_is_read_again(
    db_url: str, backend: str
) -> None:
    """The interleaving a server restart made: a page was read, then its result was lost
    before the read transaction had ended for the reader (on PostgreSQL the page is one
    statement, so its reply is what gets lost; on SQLite the end-of-page check fails). The
    retried read must hand that page out, not start after it. (A real restart in the
    middle of a feed is the restart test above.)"""
    from eventstore.engine.engine import Engine

    with make_store(db_url) as store:
        store.append("a", [_send(0)])
    engine = Engine(db_url)
    st = engine.storage
    name = "read_feed"
    step, failed = getattr(st, name), []

    def dying_step(*args: Any, **kwargs: Any) -> Any:
        out = step(*args, **kwargs)
        if not failed:
            failed.append(True)
            engine.append("b", [_send(0)])  # a later commit, so the retried read has more to find
            raise StorageError("connection lost", retryable=True)
        return out

    setattr(st, name, dying_step)
    try:
        with engine.feed(idle_timeout=SAFETY) as follower:
            got = list(itertools.islice(follower, 2))
    finally:
        engine.close()
    assert failed
    assert [(e.session_id, e.version) for e in got] == [("a", 1), ("b", 1)]


def test_a_page_whose_events_could_not_be_named_is_read_again(db_url: str, backend: str) -> None:
    """The interleaving behind a gap a server restart made at the feed's start: the first
    page was read, then the read naming its events (a transaction of its own) lost its
    connection. The retried read must hand that page out, not start after it."""
    from eventstore.engine.engine import Engine

    with make_store(db_url) as store:
        store.append("a", [_send(0)])
        store.append("b", [_send(0)])
    engine = Engine(db_url)
    st = engine.storage
    step, failed = st.records, []

    def dying_step(*args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(True)
            engine.append("c", [_send(0)])  # a later commit, so the retried read has more to find
            raise StorageError("connection lost", retryable=True)
        return step(*args, **kwargs)

    setattr(st, "records", dying_step)
    try:
        with engine.feed(idle_timeout=SAFETY) as follower:
            got = list(itertools.islice(follower, 3))
    finally:
        engine.close()
    assert failed
    assert [(e.session_id, e.version) for e in got] == [("a", 1), ("b", 1), ("c", 1)]


def test_sqlite_gap_a_held_write_transaction_is_delivered_when_it_commits(tmp_path: Any) -> None:
    path = tmp_path / "events.db"
    with make_store(f"sqlite:///{path}") as store:
        store.append("a", [_send(0)])
        position = list(store.feed(idle_timeout=0))[-1].position
        follower = Consumer(store.feed(after=position, idle_timeout=SAFETY))
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO events (session_pk, version, type, turn, payload, recorded_at, hash, xact) "
                "SELECT pk, 2, 'stop', 0, x'7b7d', 0, x'00', (SELECT max(xact) + 1 FROM events) "
                "FROM sessions WHERE id = 'a'"
            )
            assert list(store.feed(after=position, idle_timeout=0)) == []  # not committed yet
            conn.execute("UPDATE sessions SET head = 2 WHERE id = 'a'")
            conn.execute("COMMIT")
        finally:
            conn.close()
        store.append("b", [_send(0)])
        got = follower.wait_for(2)
        assert [(e.session_id, e.version) for e in got] == [("a", 2), ("b", 1)]


def test_follow_reaches_a_new_event_through_the_watcher(store: EventStore) -> None:
    """The wake-up path: a follower blocked with no timeout gets the next commit."""
    store.append("s1", [_send(0)])
    follower = store.follow("s1", after=1, idle_timeout=None)
    consumer = Consumer(follower)
    store.append("s1", [_send(1)])
    assert [e.version for e in consumer.wait_for(1)] == [2]
    follower.close()


def test_recorded_event_json_has_a_position_only_from_the_feed(store: EventStore) -> None:
    store.append("s1", [_send(0)])
    [from_history] = list(store.history("s1"))
    [from_feed] = list(store.feed(idle_timeout=0))
    assert "position" not in from_history.to_json()
    assert from_feed.to_json()["position"] == from_feed.position
    assert {k: v for k, v in from_feed.to_json().items() if k != "position"} == from_history.to_json()


# -- the CLI: tail and feed, as real processes ----------------------------------------------

EXE = str(Path(sys.executable).parent / "eventstore")


def _cli(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    # A run to its end: forked from the warm program (cli_helpers); the following runs
    # below, signalled and read line by line, start the real console script.
    return run_cli(*args, db=db_url, code=None)


def _started(db_url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [EXE, "--db", db_url, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A process that never ends is asked for its threads' stacks (_finished).
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )


def _finished(p: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = p.communicate(timeout=SAFETY)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack, then it dies
        _, err = p.communicate(timeout=SAFETY)
        pytest.fail(f"the process did not end within {SAFETY} s; its threads:\n{err[-8000:]}")
    return p.returncode, err


def test_cli_tail_prints_lines_and_json_lines_with_control_characters_escaped(store: EventStore, db_url: str) -> None:
    store.append("ada@example.com", [{"type": "send", "id": "u-1", "text": "hi \x1b[2J\u202e"}, {"type": "stop"}])
    human = _cli(db_url, "tail", "ada@example.com")
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert len(lines) == 2 and "ada@example.com@1" in lines[0] and "ada@example.com@2" in lines[1]
    assert "\x1b" not in human.stdout and "\u202e" not in human.stdout
    assert "\\x1b" in lines[0]
    as_json = _cli(db_url, "tail", "ada@example.com", "--after", "1", "--json")
    docs = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [(d["session"], d["version"], d["type"]) for d in docs] == [("ada@example.com", 2, "stop")]


def test_cli_feed_resumes_after_a_printed_position(store: EventStore, db_url: str) -> None:
    store.append("a", [_send(0)])
    store.append("b", [_send(0), _send(1)])
    first = [json.loads(line) for line in _cli(db_url, "feed", "--json").stdout.splitlines()]
    assert [(d["session"], d["version"]) for d in first] == [("a", 1), ("b", 1), ("b", 2)]
    rest = _cli(db_url, "feed", "--after", first[0]["position"])
    assert [line.split()[0] for line in rest.stdout.splitlines()] == [d["position"] for d in first[1:]]
    bad = _cli(db_url, "feed", "--after", "nonsense")
    assert bad.returncode == 1 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr


def test_cli_tail_follow_prints_new_events_and_stops_cleanly_on_ctrl_c(store: EventStore, db_url: str) -> None:
    store.append("s1", [_send(0)])
    p = _started(db_url, "tail", "s1", "--follow", "--json")
    assert p.stdout is not None
    assert json.loads(p.stdout.readline())["version"] == 1
    store.append("s1", [_send(1)])
    assert json.loads(p.stdout.readline())["version"] == 2  # arrives while it follows
    p.send_signal(signal.SIGINT)
    code, err = _finished(p)
    assert code == 0 and "Traceback" not in err


@pytest.mark.parametrize("command", [["tail", "s1", "--follow"], ["feed", "--follow"]])
def test_cli_follow_exits_0_when_its_reader_goes_away(store: EventStore, db_url: str, command: list[str]) -> None:
    """`eventstore tail s1 --follow | head -1`: the reader leaves while the follower waits
    for a commit that never comes; the process must notice and end quietly."""
    store.append("s1", [_send(0), _send(1)])
    p = _started(db_url, *command)
    assert p.stdout is not None
    assert "s1@1" in p.stdout.readline()
    p.stdout.close()  # what `head -1` does after its line
    code, err = _finished(p)
    assert code == 0 and err == ""


# -- the async twin ----------------------------------------------------------------------------


def _arun(coro: Any) -> Any:
    return asyncio.run(coro)


def test_async_follow_and_feed_match_the_sync_ones(db_url: str, raw_engine: Engine) -> None:
    """8 concurrent async writers, an async feed and an async follow of a shared session; the
    sync store reads the same database, and its positions resume the async feed."""
    make_store(db_url).close()

    async def main() -> tuple[list[RecordedEvent], list[int], int]:
        async with AsyncEventStore(db_url) as astore:
            await astore.append("shared", [_send(0)])
            feed = astore.feed(idle_timeout=SAFETY)
            follow = astore.follow("shared", idle_timeout=SAFETY)

            async def write(w: int) -> None:
                for b in range(6):
                    session = f"own-{w}" if b % 2 == 0 else "shared"
                    await astore.append(session, [_send(k) for k in range(1 + (w + b) % 3)])

            await asyncio.gather(*(write(w) for w in range(8)))
            total = len(_stored(raw_engine))
            got: list[RecordedEvent] = []
            async for ev in feed:
                got.append(ev)
                if len(got) == total:
                    break
            head = await astore.head("shared")
            versions = []
            async for ev in follow:
                versions.append(ev.version)
                if ev.version == head:
                    break
            assert follow.version == head and follow.position is None
            await feed.aclose()
            await follow.aclose()
            return got, versions, head

    got, versions, head = _arun(main())
    _check_feed(got, _stored(raw_engine))
    assert versions == list(range(1, head + 1))
    with EventStore(db_url) as store:
        sync = list(store.feed(idle_timeout=0))
        assert [e.position for e in sync] == [e.position for e in got]

    async def resume(position: str) -> list[tuple[str, int]]:
        async with AsyncEventStore(db_url) as astore:
            return [(e.session_id, e.version) async for e in astore.feed(after=position, idle_timeout=0)]

    middle = len(sync) // 2
    assert _arun(resume(sync[middle].position)) == [(e.session_id, e.version) for e in sync[middle + 1 :]]


def test_async_feed_reads_again_a_page_whose_events_could_not_be_named(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The async twin drives the same plan: a page whose naming read lost its connection
    is handed out by the retried read, not skipped."""
    from eventstore.engine import reads

    with make_store(db_url) as store:
        store.append("a", [_send(0)])
        store.append("b", [_send(0)])
    step, failed = reads.feed_names, []

    def dying_step(*args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(True)
            raise StorageError("connection lost", retryable=True)
        return step(*args, **kwargs)

    monkeypatch.setattr(reads, "feed_names", dying_step)

    async def main() -> list[tuple[str, int]]:
        async with AsyncEventStore(db_url) as astore:
            got: list[tuple[str, int]] = []
            feed = astore.feed(idle_timeout=SAFETY)
            async for ev in feed:
                got.append((ev.session_id, ev.version))
                if len(got) == 2:
                    break
            await feed.aclose()
            return got

    got = _arun(main())
    assert failed
    assert got == [("a", 1), ("b", 1)]


def test_async_follow_refuses_bad_arguments_when_iteration_starts(db_url: str) -> None:
    make_store(db_url).close()

    async def main() -> None:
        async with AsyncEventStore(db_url) as astore:
            await astore.append("s1", [_send(0)])
            for follower, error in (
                (astore.follow("nope"), SessionNotFound),
                (astore.follow("s1", after=5), VersionNotFound),
                (astore.follow("s1", idle_timeout=-1), InvalidEvent),
                (astore.feed(after="x"), InvalidEvent),
            ):
                with pytest.raises(error):
                    async for _ in follower:
                        pass

    _arun(main())


def test_async_follower_closed_by_another_task_stops(db_url: str) -> None:
    make_store(db_url).close()

    async def main() -> list[int]:
        async with AsyncEventStore(db_url) as astore:
            await astore.append("s1", [_send(0)])
            follower = astore.follow("s1", idle_timeout=None)
            seen: list[int] = []

            async def consume() -> None:
                async for ev in follower:
                    seen.append(ev.version)

            task = asyncio.create_task(consume())
            await astore.append("s1", [_send(1)])
            await await_until(lambda: len(seen) >= 2, "the follower never handed out both events")
            follower.close()  # the consumer is waiting for a commit that never comes
            await asyncio.wait_for(task, SAFETY)
            assert follower.caught_up and follower.lag == 0.0
            return seen

    assert _arun(main()) == [1, 2]


def test_postgresql_gap_holds_the_async_feed_too(pg_schema: str) -> None:
    make_store(pg_schema).close()

    async def main() -> None:
        async with AsyncEventStore(pg_schema) as astore:
            await astore.append("held", [_send(0)])
            position = [e async for e in astore.feed(idle_timeout=0)][-1].position
            conn, xid = _hold_oldest_transaction(_pg_dsn(pg_schema))
            try:
                await astore.append("later", [_send(0), _send(1)])
                assert [e async for e in astore.feed(after=position, idle_timeout=0)] == []
                waiting = astore.feed(after=position, idle_timeout=SAFETY)
                first = asyncio.ensure_future(waiting.__anext__())
                # Lets the follower start reading (it re-reads while the gap holds; before
                # the commit or after, it must hand out the held event first): not a wait.
                await asyncio.sleep(0)
                _raw_insert(conn, "held", 2)
                conn.commit()
            finally:
                conn.close()
            ev = await asyncio.wait_for(first, SAFETY)
            assert (ev.session_id, ev.version) == ("held", 2)
            assert int(ev.position.split(".")[0], 16) == xid  # type: ignore[union-attr]
            rest = [(await waiting.__anext__()).version for _ in range(2)]
            assert rest == [1, 2]
            await waiting.aclose()

    _arun(main())


def test_a_follower_reading_from_a_lagging_replica_still_gets_the_commit_it_was_woken_for(
    pg_schema: str, replica_url: str
) -> None:
    """Woken by a commit on the primary, the next read must see it: with the replica's
    replay paused, it comes from the primary (after ``replica_wait``)."""
    replicated = _replicated(pg_schema, replica_url, replica_wait=0.2)
    plain = EventStore(pg_schema)
    try:
        plain.append("s1", [_send(0)])
        consumer = Consumer(replicated.follow("s1", idle_timeout=SAFETY))
        consumer.wait_until(1)
        _sql(replica_url, "SELECT pg_wal_replay_pause()")
        try:
            _wait_until_paused(replica_url)
            plain.append("s1", [_send(1)])
            assert [e.version for e in consumer.wait_for(2)] == [1, 2]
        finally:
            _sql(replica_url, "SELECT pg_wal_replay_resume()")
    finally:
        replicated.close()
        plain.close()


def test_postgresql_a_band_read_that_loses_its_connection_at_once_is_sent_again(pg_schema: str) -> None:
    """A band is read on a pooled connection taken without the pre-ping (one round trip);
    one that died in the pool unnoticed fails the first attempt, and the read is sent once
    more, so even a feed that must not wait (``idle_timeout=0``) gets its events."""
    from contextlib import contextmanager

    from eventstore.engine.engine import Engine

    with make_store(pg_schema) as store:
        store.append("a", [_send(0)])
    engine = Engine(pg_schema)
    st: Any = engine.storage
    real, failed = st._autocommit, []

    class DeadCursor:
        def execute(self, *args: Any, **kwargs: Any) -> None:
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    @contextmanager
    def first_dead(*, hot: bool) -> Any:
        if not failed:
            failed.append(hot)
            yield DeadCursor()
            return
        with real(hot=hot) as cur:
            yield cur

    st._autocommit = first_dead
    try:
        got = [(e.session_id, e.version) for e in engine.feed(idle_timeout=0)]
    finally:
        engine.close()
    assert failed == [True]
    assert got == [("a", 1)]


def test_the_feed_of_a_replicated_store_reads_a_replica_that_has_replayed_its_writes(
    pg_schema: str, replica_url: str
) -> None:
    """A band is read through the store's read path: a replica that has replayed this
    store's appends serves it (the primary's one-round-trip read is not taken)."""
    replicated = _replicated(pg_schema, replica_url)
    try:
        for i in range(3):
            replicated.append(f"s{i}", [_send(0), _send(1)])
        before = replicated.read_counts["replica"]
        got = [(e.session_id, e.version) for e in replicated.feed(idle_timeout=0)]
        assert sorted(got) == [(f"s{i}", v) for i in range(3) for v in (1, 2)]  # each once
        assert all(got.index((s, 1)) < got.index((s, 2)) for s, _ in got)  # in version order
        assert replicated.read_counts["replica"] > before
    finally:
        replicated.close()


def _leave_summaries_to_the_store(conn: psycopg.Connection[Any]) -> list[str]:
    """Keep autovacuum from summarizing the feed's BRIN ranges behind the store's back
    (returns the leaf tables of ``events``). ``autovacuum_enabled = false`` alone is not
    enough: the index's ``autosummarize`` work items are run by the next autovacuum worker
    to visit the database whatever the table says, at a moment of the launcher's choosing."""
    leaves = "SELECT relid::regclass::text FROM pg_partition_tree(%s) WHERE isleaf"
    tables = [r[0] for r in conn.execute(leaves, ("events",))] or ["events"]
    for table in tables:
        conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    for index in [r[0] for r in conn.execute(leaves, ("ix_events_xact",))] or ["ix_events_xact"]:
        conn.execute(f"ALTER INDEX {index} SET (autosummarize = off)")
    return tables


def _unsummarized_tail(url: str) -> tuple[int, int]:
    """(table pages a band above every event reads, table pages): the pages of the feed's
    BRIN ranges not summarized yet, which every band reads whatever it asks for."""
    with psycopg.connect(_pg_dsn(url)) as conn:
        conn.execute("SET LOCAL enable_seqscan = off")
        top = conn.execute("SELECT max(xact) FROM events").fetchone()[0]  # type: ignore[index]
        plan = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) SELECT * FROM events WHERE xact > %s", (top,)
        ).fetchone()[0][0]["Plan"]  # type: ignore[index]
        pages = conn.execute(
            "SELECT sum(pg_relation_size(relid)) / current_setting('block_size')::int "
            "FROM pg_partition_tree('events') WHERE isleaf"
        ).fetchone()[0] or conn.execute(  # type: ignore[index]
            "SELECT pg_relation_size('events') / current_setting('block_size')::int"
        ).fetchone()[0]  # type: ignore[index]
    read, todo = 0, [plan]
    while todo:
        node = todo.pop()
        read += node.get("Exact Heap Blocks", 0) + node.get("Lossy Heap Blocks", 0)
        todo.extend(node.get("Plans", []))
    return read, int(pages)


@pytest.mark.parametrize("partitions", [0, 2])
def test_postgresql_the_writing_store_summarizes_the_feed_index_as_it_goes(
    pg_schema: str, partitions: int
) -> None:
    """A band reads every BRIN range not summarized yet; autovacuum (off here) would leave a
    minute of writes so. The writing store summarizes the complete ranges itself — at most
    once a second while commits come, once more when they stop —, leaving two ranges of
    16 pages per table to the inserts."""
    with EventStore(pg_schema, partitions=partitions, seal=False) as store:
        store.migrate()
        with psycopg.connect(_pg_dsn(pg_schema), autocommit=True) as conn:
            tables = _leave_summaries_to_the_store(conn)
        for i in range(100 * (1 + partitions)):
            store.append(f"s{i % 7}", [_send(k) for k in range(100)])
        read, pages = _unsummarized_tail(pg_schema)
        assert pages > 6 * 16 * len(tables)  # enough complete ranges to summarize
        deadline = time.monotonic() + SAFETY
        while read > 2 * 16 * len(tables) and time.monotonic() < deadline:
            time.sleep(0.1)  # the notifier's last summary comes once it has been quiet a while
            read, pages = _unsummarized_tail(pg_schema)
        assert read <= 2 * 16 * len(tables), (read, pages)
        assert list(store.feed(idle_timeout=0))[-1].session_id.startswith("s")


def test_postgresql_a_store_skips_summarizing_while_another_summarizes(pg_schema: str) -> None:
    """Summarizing locks the table against itself: a store that finds another one at it
    (here: its advisory lock held from outside) skips, without waiting, and summarizes the
    next time it can."""
    lock = "hashtextextended('eventstore summarize ' || 'events'::regclass::oid::text, 0)"
    skips = _SkipLog()
    logger = logging.getLogger("eventstore.storage.postgres.summarizer")
    logger.addHandler(skips)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        _skips_while_another_summarizes(pg_schema, lock, skips)
    finally:
        logger.removeHandler(skips)
        logger.setLevel(old_level)


class _SkipLog(logging.Handler):
    """Counts the summarizer's "another store is summarizing" records (any thread)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "another store is summarizing" in record.getMessage():
            self.count += 1


def _skips_while_another_summarizes(pg_schema: str, lock: str, skips: _SkipLog) -> None:
    # seal=False: sealing deletes closed turns' rows, changing the pages a band reads.
    with EventStore(pg_schema, seal=False) as store:
        store.migrate()
        with psycopg.connect(_pg_dsn(pg_schema), autocommit=True) as other:
            _leave_summaries_to_the_store(other)
            other.execute(f"SELECT pg_advisory_lock({lock})")
            for i in range(100):
                store.append(f"s{i % 7}", [_send(k) for k in range(100)])
            seen = skips.count
            # The notifier's last summary comes once the writes stop: it ran, and skipped.
            wait_until(lambda: skips.count > seen, "no summary was tried after the writes")
            read, pages = _unsummarized_tail(pg_schema)
            assert read > 4 * 16, (read, pages)  # skipped: another store holds the lock
            other.execute(f"SELECT pg_advisory_unlock({lock})")
        store.append("s0", [_send(0)])
        deadline = time.monotonic() + SAFETY
        while read > 2 * 16 and time.monotonic() < deadline:
            time.sleep(0.1)
            read, pages = _unsummarized_tail(pg_schema)
        assert read <= 2 * 16, (read, pages)
