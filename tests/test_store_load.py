"""The one-statement load path (``Storage.load_parts``) against the general one (``_state_at``).

``EventStore.load`` of a root session reads the session row, the newest usable snapshot,
its message bodies and the tail in one statement (PostgreSQL) or one read transaction
(SQLite); branches take the general path. Both must give the same state for every
version, refuse the same bad versions, and fail loudly on a missing blob.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
from conftest import BACKENDS, PARTITIONED, make_store
from sqlalchemy import Engine, text

import eventstore.engine.engine as store_mod
from eventstore.errors import (
    InvalidEvent,
    SessionErased,
    SessionNotFound,
    StorageError,
    VersionNotFound,
)
from eventstore.core.reducer import fold_json
from eventstore.samples import chat_session, random_actions
from eventstore import EventStore

pytestmark = [pytest.mark.twins, pytest.mark.usefixtures("twin")]


@pytest.fixture(params=[*BACKENDS, PARTITIONED])
def backend(request: pytest.FixtureRequest) -> str:
    """The load path also runs on the session-partitioned PostgreSQL schema (where a load
    names the partition key it remembers for the session)."""
    return str(request.param)


def test_storage_slices_digests_of_the_codecs_size() -> None:
    from eventstore.core import codec, rows

    assert rows.DIGEST_SIZE == codec.DIGEST_SIZE


def _split(digests: bytes) -> list[bytes]:
    from eventstore.core.codec import DIGEST_SIZE

    return [digests[i : i + DIGEST_SIZE] for i in range(0, len(digests), DIGEST_SIZE)]


def test_chunks_join_to_the_message_array_and_share_unchanged_prefixes() -> None:
    import hashlib

    from eventstore.core.codec import DIGEST_SIZE, SnapshotCodec, chunk_spans, unpack_blob

    state = fold_json(None, chat_session(6, seed=2))
    n = len(state["messages"])
    assert n > 10
    codec = SnapshotCodec(chunk_messages=2, growth=2)
    rest, digests, blobs = codec.encode(state)
    order = _split(digests)
    spans = chunk_spans(n, 2, 2)
    assert len(order) == len(spans) <= 2 * n.bit_length()  # blobs of 2, 4, 8, ... messages
    assert SnapshotCodec.decode(rest, [blobs[d] for d in order]) == state
    assert all(hashlib.sha256(body).digest()[:DIGEST_SIZE] == d for d, body in blobs.items())
    assert all(len(body) < len(unpack_blob(body)) for body in blobs.values() if len(unpack_blob(body)) > 200)
    # More messages: every chunk range both states have, before the last message, keeps
    # its digest (stored once).
    longer = fold_json(state, chat_session(7, seed=2)[len(chat_session(6, seed=2)) :])
    more = dict(zip(chunk_spans(len(longer["messages"]), 2, 2), _split(codec.encode(longer)[1])))
    kept = [(span, d) for span, d in zip(spans, order) if span[1] < n]
    assert kept and all(more[span] == d for span, d in kept if span in more)
    assert sum(span in more for span, _ in kept) >= len(kept) - 2


def test_a_codec_load_reuses_the_messages_of_blobs_it_decoded_and_stays_within_its_budget() -> None:
    from eventstore.core.codec import SnapshotCodec, unpack_blob

    actions = chat_session(12, seed=5)
    late = fold_json(None, actions)
    # An older state with a few messages fewer: its large chunks are the newer one's.
    n = len(late["messages"])
    cut = next(
        i for i in range(len(actions), 0, -1) if len(fold_json(None, actions[:i])["messages"]) < n - 2
    )
    early = fold_json(None, actions[:cut])
    writer = SnapshotCodec(chunk_messages=2, growth=2)
    stored = {}
    for state in (early, late):
        rest, digests, blobs = writer.encode(state)
        stored[id(state)] = (rest, [blobs[d] for d in _split(digests)])
    codec = SnapshotCodec(chunk_messages=2, growth=2)
    first = codec.load(*stored[id(late)])
    rest, blobs = stored[id(late)]
    again = codec.load(rest, [bytes(bytearray(b)) for b in blobs])
    assert first == again == SnapshotCodec.decode(rest, blobs) == late
    # The same blobs read again (other bytes objects, same bytes) give the same messages.
    assert first["messages"] is not again["messages"]
    assert all(a is b for a, b in zip(first["messages"], again["messages"]))
    # An older snapshot shares full chunks with the newer one: their messages too.
    assert set(stored[id(early)][1]) & set(blobs)
    older = codec.load(*stored[id(early)])
    assert older == early
    assert older["messages"][0] is first["messages"][0]
    # Over the budget the cache starts again; 0 turns it off. Either way the state is the same.
    biggest = max(len(unpack_blob(b)) for b in blobs)
    for budget in (biggest, 0):
        bounded = SnapshotCodec(chunk_messages=2, growth=2, max_decoded=budget)
        loads = [bounded.load(rest, blobs) for _ in range(2)]
        assert loads[0] == loads[1] == late
        if budget == 0:
            assert loads[0]["messages"][0] is not loads[1]["messages"][0]


def test_blobs_of_every_packing_read_back_as_the_same_messages() -> None:
    from eventstore.core.codec import SnapshotCodec, blob_array, pack_blob, unpack_blob

    body = b'{"id":"a","parts":[]},{"id":"b","parts":[{"text":"x","type":"text"}]}'
    today, earlier = pack_blob(body), pack_blob(body, array=False)
    assert today[:1] == b"\x02" and earlier[:1] == b"\x01"
    for stored in (today, earlier, body):  # LZ4 of an array, LZ4 of the body, raw JSON
        assert unpack_blob(stored) == body
        assert blob_array(stored) == b"[" + body + b"]"
    expected = orjson.loads(b"[" + body + b"]") * 3
    assert SnapshotCodec.messages([today, earlier, body]) == expected
    assert SnapshotCodec().load(b'{"status":"idle"}', [today, earlier, body])["messages"] == expected


def test_chunk_spans_take_the_largest_aligned_blobs_first() -> None:
    from eventstore.core.codec import chunk_spans

    assert chunk_spans(600, 8, 8) == [(0, 512), (512, 576), (576, 584), (584, 592), (592, 600)]
    assert chunk_spans(7, 8, 8) == [(0, 7)]
    assert chunk_spans(0, 8, 8) == []
    assert chunk_spans(10, 4, 1) == [(0, 4), (4, 8), (8, 10)]
    for n in range(0, 300, 7):
        spans = chunk_spans(n, 3, 4)
        assert [i for s in spans for i in range(*s)] == list(range(n))


# (messages per chunk, growth, packed, array): one raw blob per message (the first format),
# flat raw chunks of 16 (the format before blobs were packed), packed growing chunks without
# brackets (the format before blobs held arrays), packed arrays of growing chunks (today's).
@pytest.mark.parametrize(
    "fmt",
    [
        (1, 1, False, True),
        (16, 1, False, True),
        (3, 2, True, False),
        (8, 8, True, False),
        (3, 2, True, True),
        (8, 8, True, True),
    ],
)
def test_snapshots_of_any_format_load_alike(db_url: str, fmt: tuple[int, int, bool, bool]) -> None:
    from eventstore.core.codec import SnapshotCodec

    actions = chat_session(6, seed=fmt[0])
    make_store(db_url).close()
    writer = store_mod.Engine(db_url, snapshot_every=7)
    writer.planner.codec = SnapshotCodec(chunk_messages=fmt[0], growth=fmt[1], packed=fmt[2], array=fmt[3])
    half = len(actions) // 2
    for i in range(0, half, 30):
        writer.append("s", actions[i : min(half, i + 30)])
    writer.close()
    with EventStore(db_url, snapshot_every=7) as reader, _general_path(db_url) as general:
        for v in range(0, half + 1, 11):
            assert reader.load("s", version=v).to_json() == fold_json(None, actions[:v]), v
            assert general("s", v) == fold_json(None, actions[:v]), v
        # Today's writer goes on after snapshots of the older format.
        for i in range(half, len(actions), 30):
            reader.append("s", actions[i : i + 30])
        for v in range(0, len(actions) + 1, 11):
            assert reader.load("s", version=v).to_json() == fold_json(None, actions[:v]), v
        assert reader.verify("s").ok


@contextmanager
def _general_path(db_url: str) -> Iterator[Callable[[str, int], dict[str, Any]]]:
    """``state(session, version)`` through the engine's general path (lineage, snapshot,
    tail), never the one-statement read: on an engine of its own, apart from the store
    under test, opened once per test (opening one compiles every statement again)."""
    engine = store_mod.Engine(db_url)

    def state(session: str, version: int) -> dict[str, Any]:
        with engine.storage.read() as tx:
            return engine.state_at(tx, engine.row(tx, session), version)

    try:
        yield state
    finally:
        engine.close()


@pytest.mark.parametrize("every", [1, 5, 64])
def test_every_version_matches_the_fold_and_the_general_path(db_url: str, every: int) -> None:
    actions = random_actions(random.Random(every), 60)
    with make_store(db_url, snapshot_every=every) as store:
        store.append("s", actions[:25])
        store.append("s", actions[25:])
        with _general_path(db_url) as general:
            for v in range(61):
                got = store.load("s", version=v).to_json()
                assert got == fold_json(None, actions[:v]), v
                assert got == general("s", v), v
        assert store.load("s").to_json() == fold_json(None, actions)


def test_chat_session_with_repeated_messages(db_url: str) -> None:
    # The same message twice in a state has one blob and two digests: both come back.
    actions = chat_session(3, seed=1)
    with make_store(db_url, snapshot_every=16) as store:
        store.append("a", actions)
        store.append("b", actions)  # identical states: every blob shared with "a"
        expected = fold_json(None, actions)
        assert store.load("a").to_json() == expected
        assert store.load("b").to_json() == expected


def test_another_reducer_version_ignores_the_snapshots(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    actions = random_actions(random.Random(3), 40)
    with make_store(db_url, snapshot_every=4) as store:
        store.append("s", actions)
        monkeypatch.setattr(store_mod, "REDUCER_VERSION", 999)
        for v in (1, 4, 17, 40):
            assert store.load("s", version=v).to_json() == fold_json(None, actions[:v])


def test_bad_sessions_and_versions(store: EventStore) -> None:
    store.append("s", random_actions(random.Random(4), 5))
    with pytest.raises(SessionNotFound):
        store.load("nope")
    for bad in (6, -1, 2**40, 2**31):
        with pytest.raises(VersionNotFound):
            store.load("s", version=bad)
    for wrong_type in (True, "3", 1.0):
        with pytest.raises(InvalidEvent, match="version"):
            store.load("s", version=wrong_type)  # type: ignore[arg-type]
    assert store.load("s", version=0).to_json() == fold_json(None, ())


def test_a_load_never_trusts_a_remembered_key_that_names_another_row(
    db_url: str, raw_engine: Engine
) -> None:
    # The PostgreSQL load names the session key it learnt from an earlier load; the row
    # must still be found by its id when that key has gone (erased) or names another id.
    a, b = chat_session(1, seed=1, deltas=3), chat_session(2, seed=2, deltas=3)
    with make_store(db_url) as store, make_store(db_url) as other:
        store.append("a", a)
        store.append("b", b)
        store.append("gone", a)
        for sid in ("a", "b", "gone"):
            store.load(sid)
        other.erase("gone", reason="test")
        with pytest.raises(SessionErased):
            store.load("gone")
        with raw_engine.begin() as conn:  # swap the two ids behind the store's back
            for old, new in (("a", "tmp"), ("b", "a"), ("tmp", "b")):
                conn.execute(
                    text("UPDATE sessions SET id = :new WHERE id = :old"), {"old": old, "new": new}
                )
        assert store.load("a").to_json() == fold_json(None, b)
        assert store.load("b", version=2).to_json() == fold_json(None, a[:2])
        assert store.load("b").to_json() == fold_json(None, a)


def test_branch_loads_take_the_general_path(db_url: str) -> None:
    actions = random_actions(random.Random(5), 30)
    with make_store(db_url, snapshot_every=4) as store:
        store.append("root", actions[:20])
        store.branch("root", at=10, new_id="kid")
        store.append("kid", actions[20:], expected_version=10)
        lineage = actions[:10] + actions[20:]
        for v in range(21):
            assert store.load("kid", version=v).to_json() == fold_json(None, lineage[:v]), v
        assert store.load("kid").to_json() == fold_json(None, lineage)


def test_a_missing_blob_is_a_storage_error(db_url: str, raw_engine: Engine) -> None:
    actions = chat_session(2, seed=2)
    with make_store(db_url, snapshot_every=8) as store:
        store.append("s", actions)
        store.branch("s", new_id="kid")
        with raw_engine.begin() as conn:
            conn.execute(text("DELETE FROM snapshot_blobs"))
        with pytest.raises(StorageError, match="missing message blob"):
            store.load("s")
        with pytest.raises(StorageError, match="missing message blob"):
            store.load("kid")


@pytest.mark.parametrize("socket_shows_it", [True, False])
def test_a_load_survives_killed_pooled_connections(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch, socket_shows_it: bool
) -> None:
    # The load skips the checkout's pre-ping; a dead pooled connection must cost a retry,
    # never an error, since a read is idempotent. With `socket_shows_it` False the checkout
    # cannot tell (a backend killed a moment ago): the statement itself fails and is retried.
    import psycopg

    import eventstore.storage.postgres.connections as pg_mod

    if not socket_shows_it:
        monkeypatch.setattr(pg_mod, "_readable", lambda _conn: False)
    actions = chat_session(2, seed=3)
    # Only this store's backends are killed: the server is shared with other tests (and
    # with the other pytest-xdist workers), whose connections must live on.
    tag = f"es-load-{uuid.uuid4().hex[:10]}"
    with make_store(f"{pg_schema}&application_name={tag}", snapshot_every=16) as store:
        store.append("s", actions)
        expected = fold_json(None, actions)
        assert store.load("s").to_json() == expected
        dsn = pg_schema.replace("postgresql+psycopg://", "postgresql://", 1)
        for _ in range(3):
            with psycopg.connect(dsn, autocommit=True) as admin:
                killed = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE pid <> pg_backend_pid() AND application_name = %s",
                    (tag,),
                ).fetchone()
            assert killed is not None and killed[0] >= 1, "the store had no pooled connection"
            assert store.load("s").to_json() == expected
            assert store.load("s", version=5).to_json() == fold_json(None, actions[:5])
