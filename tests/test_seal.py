"""Sealed segments: every public read is the same before and after sealing, on both backends.

Stores here are opened with ``seal=False`` and sealed with ``store.seal()`` at the point a
test chooses, so that "before" is all rows and "after" is all segments; the background
sealers (the default: the sync store's thread, the async store's task) have tests of their
own.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from conftest import await_until, make_store, wait_until
from eventstore import AsyncEventStore, EventStore, fold, generate_keypair
from eventstore.errors import SegmentCorrupt
from eventstore.samples import chat_session
from eventstore.storage import open_storage

TURNS = 4


def _write(store: EventStore, session: str, actions: list[dict[str, Any]], step: int = 9) -> None:
    for i in range(0, len(actions), step):
        store.append(session, actions[i : i + step], event_ids=[f"{session}-{j}" for j in range(i, min(i + step, len(actions)))])


def _everything(store: EventStore, sessions: list[str]) -> dict[str, Any]:
    """Every public read this module compares, as plain data."""
    out: dict[str, Any] = {}
    for s in sessions:
        head = store.head(s)
        out[s] = {
            "loads": [store.load(s, version=v).to_json() for v in range(head + 1)],
            "history": [e.to_json() for e in store.history(s)],
            "history_desc": [e.to_json() for e in store.history(s, desc=True, limit=30)],
            "replay": [(step.event.to_json(), step.after) for step in store.replay(s, after=3, upto=min(head, 120))],
            "diff": store.diff((s, 10), (s, None), events=True).to_json(),
            "turns": [t.to_json() for t in store.turns(s)],
            "follow": [e.to_json() for e in store.follow(s, after=head - 100, idle_timeout=0)],
        }
        buf = io.StringIO()
        store.export(s, buf)
        out[s]["export"] = buf.getvalue()
    out["feed"] = [(e.position, e.to_json()) for e in store.feed(idle_timeout=0)]
    report = store.verify()
    out["verify"] = (report.ok, report.events, report.snapshots, report.problems)
    return out


def _segments(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM event_segments")).scalar_one())
    finally:
        engine.dispose()


def _sealed_versions(url: str) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Per session id: the versions its segments stand for, and the versions
    ``sealed_event_ids`` names (with each id checked against the session's own ids)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            segments: dict[str, list[int]] = {}
            for sid, first, last in conn.execute(
                text(
                    "SELECT s.id, g.first_version, g.last_version FROM event_segments g "
                    "JOIN sessions s ON s.pk = g.session_pk ORDER BY 1, 2"
                )
            ):
                segments.setdefault(sid, []).extend(range(first, last + 1))
            ids: dict[str, list[int]] = {}
            for sid, event_id, version in conn.execute(
                text(
                    "SELECT s.id, i.event_id, i.version FROM sealed_event_ids i "
                    "JOIN sessions s ON s.pk = i.session_pk ORDER BY 1, 3"
                )
            ):
                assert event_id == f"{sid}-{version - 1}", (sid, event_id, version)
                ids.setdefault(sid, []).append(version)
            return segments, ids
    finally:
        engine.dispose()


def test_every_read_is_the_same_after_sealing(db_url: str) -> None:
    a, b = chat_session(TURNS, seed=1), chat_session(TURNS, seed=2)
    with make_store(db_url, snapshot_every=64, seal=False) as store:
        _write(store, "a", a)
        _write(store, "b", b, step=5)
        fork = store.branch("a", at=130, new_id="a-fork")  # in the middle of turn 2
        _write(store, fork, chat_session(2, seed=3))
        private, public = generate_keypair()
        checkpoint = store.checkpoint(private)
        before = _everything(store, ["a", "b", fork])
        sealed = store.seal()
        # Every turn but each session's newest; the fork's own rows are two turns.
        assert sealed == (TURNS - 1) * 2 + 1
        assert _segments(db_url) == sealed
        assert store.seal() == 0
        after = _everything(store, ["a", "b", fork])
        # Sealing keeps one snapshot in two inside sealed turns: verify checks fewer.
        (ok, n, snaps, problems), (ok0, n0, snaps0, problems0) = after.pop("verify"), before.pop("verify")
        assert (ok, n, problems) == (ok0, n0, problems0) and 0 < snaps < snaps0
        assert after == before
        assert store.verify(checkpoint=checkpoint, public_key=public).ok
        # Appending after sealing continues the chain; an idempotent retry of a sealed
        # event's id is recognised as the same append.
        again = store.append("a", a[:9], event_ids=[f"a-{j}" for j in range(9)])
        assert again.version == 9 and store.head("a") == len(a)
    with make_store(db_url, seal=False) as fresh:  # a new process reads the same
        again_fresh = _everything(fresh, ["a", "b", fork])
        assert again_fresh.pop("verify") == (ok, n, snaps, problems)
        assert again_fresh == before


def test_a_read_transaction_sees_one_snapshot_while_turns_are_sealed(db_url: str) -> None:
    # verify and export read a session in several statements (rows, segments, sealed
    # ids): a seal committing between two of them must be seen whole or not at all.
    with make_store(db_url, seal=False) as store:
        _write(store, "a", chat_session(TURNS, seed=1))
    storage = open_storage(db_url)
    count = text("SELECT count(*) FROM events")
    try:
        with storage.read() as tx:
            before = tx.execute(count).scalar()
            with make_store(db_url, seal=False) as sealer:
                assert sealer.seal() > 0
            assert tx.execute(count).scalar() == before
        with storage.read() as tx:
            assert tx.execute(count).scalar() < before
    finally:
        storage.close()


def test_the_head_load_and_checkouts_fold_the_same_events(db_url: str) -> None:
    actions = chat_session(6, seed=5)
    with make_store(db_url, snapshot_every=1000, seal=False) as store:
        _write(store, "s", actions, step=30)
        assert store.seal("s") == 5
        for v in [0, 1, 85, 86, 87, 300, len(actions) - 1, len(actions)]:
            assert store.load("s", version=v).to_json() == fold(actions[:v]).to_json(), v
        assert store.load("s").to_json() == fold(actions).to_json()


def test_a_rewind_into_a_sealed_turn_keeps_both_lines(db_url: str) -> None:
    actions = chat_session(3, seed=6)
    with make_store(db_url, seal=False) as store:
        _write(store, "s", actions)
        store.seal()
        kept = store.rewind("s", to=40)  # inside the sealed first turn
        assert kept is not None
        assert store.load("s").to_json() == fold(actions[:40]).to_json()
        assert store.load(kept).to_json() == fold(actions).to_json()
        store.append("s", chat_session(2, seed=7))
        store.seal()
        assert store.load(kept, version=100).to_json() == fold(actions[:100]).to_json()
        assert store.verify().ok


def test_compaction_and_erasure_take_sealed_events_with_them(db_url: str) -> None:
    actions = chat_session(4, seed=8)
    with make_store(db_url, snapshot_every=32, seal=False) as store:
        _write(store, "s", actions)
        _write(store, "gone", actions)
        store.seal()
        # Every sealed event has an id here: the id table names exactly the sealed versions.
        segments, ids = _sealed_versions(db_url)
        assert set(segments) == {"s", "gone"} and ids == segments
        result = store.compact("s", upto=200)  # removes turn 1, cuts into turn 3's segment
        assert result.removed >= 86
        for v in (200, 201, 258, 259, len(actions)):
            assert store.load("s", version=v).to_json() == fold(actions[:v]).to_json(), v
        assert store.verify().ok
        segments, ids = _sealed_versions(db_url)
        assert ids == segments and "s" not in ids  # the cut segment's kept events are rows
        # A kept event is a row again, and sealed again it is found again: both retries replay.
        for resealed in (False, True):
            if resealed:
                assert store.seal("s") == 1
                segments, ids = _sealed_versions(db_url)
                assert ids == segments and min(ids["s"]) == 201
            again = store.append("s", [actions[240]], event_ids=["s-240"])
            assert again.version == 241 and store.head("s") == len(actions)
        before = _segments(db_url)
        store.erase("gone", reason="asked")
        assert _segments(db_url) == before - (TURNS - 1)
        segments, ids = _sealed_versions(db_url)
        assert "gone" not in ids and ids == segments
        assert store.verify().ok


def test_an_idempotent_append_decodes_only_the_segment_holding_its_id(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chat app sends message ids with every append: checking them against 199 sealed
    turns probes the id table and decodes the one segment holding a hit, not them all."""
    from eventstore.core.segments import SegmentCodec, decode_segment

    turns = chat_session(200, seed=12, deltas=1)
    starts = [i for i, a in enumerate(turns) if a["type"] == "send"] + [len(turns)]
    with make_store(db_url, snapshot_every=1000, seal=False) as store:
        for a, b in zip(starts, starts[1:]):
            store.append("s", turns[a:b], event_ids=[f"s-{j}" for j in range(a, b)])
        # Small closed turns share a segment: still dozens of them to decode before.
        assert store.seal("s") > 150 and _segments(db_url) > 40
        decoded: list[int] = []

        def spy(head: Any, body: bytes) -> Any:
            decoded.append(head.first_version)
            return decode_segment(head, body)

        monkeypatch.setattr(SegmentCodec, "decode", staticmethod(spy))
        a, b = starts[100], starts[101]  # turn 101, sealed: the retry returns the original
        again = store.append("s", turns[a:b], event_ids=[f"s-{j}" for j in range(a, b)])
        assert again.version == b and store.head("s") == len(turns)
        assert len(decoded) == 1 and decoded[0] <= a + 1  # the segment holding turn 101
        decoded.clear()
        # New ids (the usual append): no segment is decoded at all.
        more = chat_session(201, seed=12, deltas=1)[len(turns) :]
        store.append("s", more, event_ids=[f"new-{j}" for j in range(len(more))])
        assert decoded == [] and store.head("s") == len(turns) + len(more)


def test_a_closed_turn_is_sealed_in_the_background(db_url: str) -> None:
    actions = chat_session(3, seed=9)
    with make_store(db_url) as store:  # seal=True: the default
        _write(store, "s", actions)
        wait_until(lambda: _segments(db_url) == 2, "both closed turns sealed by the background worker")
        assert store.load("s").to_json() == fold(actions).to_json()
        assert store.seal() == 0


def test_the_async_store_seals_when_awaited(db_url: str) -> None:
    actions = chat_session(3, seed=10)

    async def run() -> tuple[int, Any]:
        async with AsyncEventStore(db_url, seal=False) as store:
            await store.migrate()
            await store.append("s", actions)
            n = await store.seal()
            return n, (await store.load("s")).to_json()

    n, state = asyncio.run(run())
    assert n == 2 and state == fold(actions).to_json()


def test_the_async_store_seals_closed_turns_in_the_background_and_readers_see_no_change(db_url: str) -> None:
    actions = chat_session(TURNS, seed=13)
    ids = [f"s-{j}" for j in range(len(actions))]
    with make_store(db_url, seal=False) as reader:

        async def run() -> tuple[dict[str, Any], dict[str, Any]]:
            async with AsyncEventStore(db_url) as store:  # seal=True: the default
                await store.migrate()
                await store.append("s", actions, event_ids=ids)  # closes turns 1 to 3
                # Read at once, holding the loop: the sealing task (a task of this loop)
                # cannot have sealed a turn yet.
                before = _everything(reader, ["s"])
                assert _segments(db_url) == 0
                await await_until(lambda: _segments(db_url) == TURNS - 1, "closed turns sealed by the task")
                assert await store.seal() == 0  # nothing left for an explicit seal
                assert (await store.load("s")).to_json() == fold(actions).to_json()
                again = await store.append("s", actions[:5], event_ids=ids[:5])  # a sealed id
                assert again.version == 5 and await store.head("s") == len(actions)
                return before, _everything(reader, ["s"])

        before, after = asyncio.run(run())
    assert after == before


def _backends(pg_url: str, app: str) -> int:
    import psycopg

    dsn = pg_url.split("?")[0].replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)).fetchone()
        return int(row[0]) if row else 0


def test_closing_the_async_store_leaves_no_sealing_task_nor_connection(db_url: str) -> None:
    app = f"es-{uuid.uuid4().hex[:12]}"
    pg = not db_url.startswith("sqlite")
    url = f"{db_url}&application_name={app}" if pg else db_url
    threads = threading.active_count()

    async def run() -> None:
        store = AsyncEventStore(url)
        await store.migrate()
        for i in range(6):  # closed turns in six sessions: the task has work when closed
            await store.append(f"s{i}", chat_session(3, seed=20 + i))
        assert any(t.get_name() == "eventstore-seal" for t in asyncio.all_tasks())
        await store.close()
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(run())
    if pg:
        wait_until(lambda: _backends(db_url, app) == 0, "every connection of the closed store gone")
    else:
        wait_until(lambda: threading.active_count() == threads, "every aiosqlite connection thread gone")
    with make_store(db_url) as store:  # what the closed store left is sealed by the next
        store.seal()
        assert store.verify().ok and all(store.head(f"s{i}") > 0 for i in range(6))


_REFUSE_SEGMENTS = {
    "sqlite": [
        "CREATE TRIGGER refuse_segments BEFORE INSERT ON event_segments "
        "BEGIN SELECT RAISE(ABORT, 'segments refused by the test'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION refuse_segments() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'segments refused by the test'; END $$",
        "CREATE TRIGGER refuse_segments BEFORE INSERT ON event_segments "
        "FOR EACH ROW EXECUTE FUNCTION refuse_segments()",
    ],
}


@pytest.mark.parametrize("form", ["sync", "async"])
def test_a_failing_sealer_never_fails_an_append_and_seals_once_it_can(db_url: str, backend: str, form: str) -> None:
    with make_store(db_url, seal=False):
        pass
    engine = create_engine(db_url)
    try:
        with engine.begin() as conn:
            for statement in _REFUSE_SEGMENTS[backend]:
                conn.execute(text(statement))
        actions = chat_session(TURNS, seed=14)
        starts = [j for j, a in enumerate(actions) if a["type"] == "send"] + [len(actions)]
        turns = [actions[a:b] for a, b in zip(starts, starts[1:])]

        def refused() -> None:
            with engine.begin() as conn:
                conn.execute(text("DROP TRIGGER refuse_segments" + (" ON event_segments" if backend != "sqlite" else "")))

        if form == "sync":
            with EventStore(db_url) as store:
                for turn in turns:  # each append closes the turn before: the sealer fails
                    store.append("s", turn)
                assert store.load("s").to_json() == fold(actions).to_json()
                assert _segments(db_url) == 0
                refused()
                wait_until(lambda: _segments(db_url) == TURNS - 1, "sealed once segments are accepted")
        else:

            async def run() -> None:
                async with AsyncEventStore(db_url) as store:
                    for turn in turns:
                        await store.append("s", turn)
                    assert (await store.load("s")).to_json() == fold(actions).to_json()
                    assert _segments(db_url) == 0
                    # From another thread: the loop must go on to end the sealer's
                    # transaction (SQLite's write lock) that the DROP waits for.
                    await asyncio.to_thread(refused)
                    await await_until(lambda: _segments(db_url) == TURNS - 1, "sealed once segments are accepted")

            asyncio.run(run())
    finally:
        engine.dispose()


@pytest.mark.parametrize("read_first", [False, True], ids=["unread", "read-and-cached"])
@pytest.mark.parametrize("column", ["body", "end_hash", "xact_digest", "prev_hash"])
def test_an_altered_segment_is_caught_by_every_read_and_by_verify(
    db_url: str, column: str, read_first: bool
) -> None:
    """Also once the store's reads have decoded (and its codec remembered) the segment
    intact: what is remembered is keyed by the bytes read, so the altered ones are checked."""
    actions = chat_session(3, seed=11)
    with make_store(db_url, snapshot_every=1000, seal=False) as store:
        _write(store, "s", actions)
        store.append("bystander", actions[:90])
        store.seal()
        if read_first:
            assert store.load("s", version=50).to_json() == fold(actions[:50]).to_json()
            assert len(list(store.history("s"))) == len(actions)
            assert len(list(store.feed(idle_timeout=0))) == len(actions) + 90
        engine = create_engine(db_url)
        try:
            with engine.begin() as conn:
                row = conn.execute(
                    text(f"SELECT {column} FROM event_segments ORDER BY session_pk, first_version LIMIT 1")
                ).scalar_one()
                forged = bytes(row)
                if column == "body":
                    forged = forged[:-1] + bytes([forged[-1] ^ 1])
                else:
                    forged = bytes([forged[0] ^ 1]) + forged[1:]
                conn.execute(
                    text(
                        f"UPDATE event_segments SET {column} = :v WHERE (session_pk, first_version) = "
                        "(SELECT session_pk, first_version FROM event_segments ORDER BY 1, 2 LIMIT 1)"
                    ),
                    {"v": forged},
                )
        finally:
            engine.dispose()
        with pytest.raises(SegmentCorrupt):
            store.load("s", version=50)
        with pytest.raises(SegmentCorrupt):
            list(store.history("s"))
        with pytest.raises(SegmentCorrupt):
            list(store.feed(idle_timeout=0))
        report = store.verify()
        assert not report.ok
        assert [(p.session, p.kind) for p in report.problems] == [("s", "sealed-segment")]
        assert store.load("bystander").to_json() == fold(actions[:90]).to_json()


_ID_EDITS = {
    "deleted": "DELETE FROM sealed_event_ids WHERE version = 5",
    "moved": "UPDATE sealed_event_ids SET version = 6 WHERE version = 5",
    "forged": (
        "INSERT INTO sealed_event_ids SELECT session_pk, 'forged', 7 FROM sealed_event_ids LIMIT 1"
    ),
}


@pytest.mark.parametrize("edit", sorted(_ID_EDITS))
def test_an_edited_sealed_id_table_is_reported_by_verify(db_url: str, edit: str) -> None:
    actions = chat_session(3, seed=13)
    with make_store(db_url, snapshot_every=1000, seal=False) as store:
        _write(store, "s", actions)
        store.seal()
        assert store.verify().ok
        engine = create_engine(db_url)
        try:
            with engine.begin() as conn:
                conn.execute(text(_ID_EDITS[edit]))
        finally:
            engine.dispose()
        report = store.verify()
        assert not report.ok
        problems = [(p.session, p.kind, p.version) for p in report.problems]
        expected = {"deleted": [5], "moved": [5, 6], "forged": [7]}[edit]
        assert problems == [("s", "sealed-id", v) for v in expected]
        if edit != "deleted":
            # The probe and the segment disagree: the append refuses rather than guess.
            ids = ["s-4"] if edit == "moved" else ["forged"]
            with pytest.raises(SegmentCorrupt):
                store.append("s", actions[4:5], event_ids=ids)


_SEALER = """
import sys
from eventstore import EventStore
from eventstore.samples import chat_session
with EventStore(sys.argv[1], seal=False) as store:
    n = 0
    while True:
        s = f"s{n % 4}"
        store.append(s, chat_session(1, seed=n))
        store.seal()
        n += 1
        if n == 8:
            print("ready", flush=True)
"""


def test_a_sealer_killed_at_any_point_loses_nothing(db_url: str, tmp_path: Path) -> None:
    """kill -9 while appending and sealing in a loop: every session still loads, verifies
    and exports the same as a fold of what was committed; no event is lost or doubled."""
    with make_store(db_url, seal=False):
        pass
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", _SEALER, db_url], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"ready"
        # Well into its loop: the kill lands at an arbitrary point of an append or a seal.
        wait_until(lambda: _segments(db_url) >= 5, "the child sealing")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    with make_store(db_url, seal=False) as store:
        report = store.verify()
        assert report.ok, report.problems
        exports = {}
        for info in store.sessions():
            events = [e.action for e in store.history(info.id)]
            assert [e.version for e in store.history(info.id)] == list(range(1, info.head + 1))
            assert store.load(info.id).to_json() == fold(events).to_json()
            buf = io.StringIO()
            store.export(info.id, buf)
            exports[info.id] = buf.getvalue()
        store.seal()  # what the killed sealer left is sealed now, and reads the same
        assert store.verify().ok
        for session, exported in exports.items():
            buf = io.StringIO()
            store.export(session, buf)
            assert buf.getvalue() == exported


def test_a_read_that_meets_an_event_as_a_row_and_sealed_keeps_one_and_a_different_row_fails() -> None:
    """A seal committing between a read's two statements shows the same event twice (its
    row, then its segment): one is kept. A row unlike the sealed event at its version was
    inserted into a sealed range: every read fails loudly."""
    from eventstore.core.rows import EventRow
    from eventstore.errors import SegmentCorrupt
    from eventstore.storage.sql.sealed import _one_each

    def ev(version: int, payload: bytes = b'{"type":"stop"}') -> EventRow:
        return EventRow(1, version, None, "stop", 1, payload, 5, None, None, b"h" * 32, None)

    assert _one_each([ev(1), ev(2), ev(2), ev(3)]) == [ev(1), ev(2), ev(3)]
    with pytest.raises(SegmentCorrupt, match="both a row and sealed"):
        _one_each([ev(1), ev(2), ev(2, b'{"type":"retry"}')])


def test_a_closed_turn_whose_rows_do_not_verify_stays_rows_and_the_turns_around_it_are_sealed(
    db_url: str, backend: str
) -> None:
    import frozen_ddl

    actions = chat_session(TURNS, seed=15)
    with make_store(db_url, seal=False) as store:
        _write(store, "s", actions)
        engine = create_engine(db_url)
        try:
            with engine.begin() as conn:  # an edit behind the triggers' back, in turn 2
                if backend == "sqlite":
                    for stmt in frozen_ddl.sqlite_drop_immutability():
                        conn.execute(text(stmt))
                else:
                    conn.execute(text("SET LOCAL session_replication_role = replica"))
                version = conn.execute(text("SELECT max(version) - 3 FROM events WHERE turn = 2")).scalar_one()
                conn.execute(
                    text("UPDATE events SET actor = 'mallory' WHERE version = :v"), {"v": version}
                )
                if backend == "sqlite":
                    for stmt in frozen_ddl.sqlite_immutability():
                        conn.execute(text(stmt))
            # Turns 1 and 3 are sealed in the same transactions as turn 2 is refused.
            assert store.seal() == 2
            assert store.seal() == 0
            with engine.connect() as conn:
                left = conn.execute(text("SELECT DISTINCT turn FROM events WHERE turn < :t ORDER BY 1"), {"t": TURNS}).scalars().all()
                sealed = conn.execute(text("SELECT first_turn FROM event_segments ORDER BY 1")).scalars().all()
        finally:
            engine.dispose()
        assert left == [2] and sealed == [1, 3]
        report = store.verify()
        assert not report.ok
        assert any(f"version {version}" in p.message for p in report.problems), report.problems
