"""Snapshot blobs are counted and collected as their last snapshot goes, never from under a writer.

Blobs are shared by digest (identical chunks across sessions, a branch's with its parent's),
so a blob can be deleted only once no snapshot names it: ``snapshot_blobs.refs`` counts the
names, in the transactions that write and delete snapshots. Sealing thins the snapshots
inside sealed turns and deletes the blobs only they named; a writer storing a snapshot that
names such a blob at the same moment must find it stored when both have committed, in
either order, on both backends.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from conftest import make_store, wait_until
from eventstore import AsyncEventStore, fold
from eventstore.core.codec import SnapshotCodec
from eventstore.core.reducer import REDUCER_VERSION
from eventstore.core.rows import DIGEST_SIZE, SnapshotRow
from eventstore.engine import sealer
from eventstore.samples import chat_session
from eventstore.storage import open_storage

EVERY = 16


def _rows(url: str, sql: str, **params: Any) -> list[Any]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql), params).all())
    finally:
        engine.dispose()


def _digests(md: bytes) -> list[bytes]:
    return [md[i : i + DIGEST_SIZE] for i in range(0, len(md), DIGEST_SIZE)]


def _counts_match_the_snapshots(url: str) -> None:
    """Every blob's count is the number of times the snapshots name it."""
    named: dict[bytes, int] = {}
    for (md,) in _rows(url, "SELECT message_digests FROM snapshots"):
        for d in _digests(bytes(md)):
            named[d] = named.get(d, 0) + 1
    stored = {bytes(d): n for d, n in _rows(url, "SELECT digest, refs FROM snapshot_blobs")}
    assert stored == named


def test_sealing_thins_sealed_snapshots_and_collects_their_blobs(db_url: str) -> None:
    actions = chat_session(6, seed=11)
    with make_store(db_url, snapshot_every=EVERY, seal=False) as store:
        for i in range(0, len(actions), 7):
            store.append("a", actions[i : i + 7])
        store.branch("a", at=100, new_id="a-fork")
        store.append("a-fork", chat_session(2, seed=12))
        for i in range(0, len(actions), 7):
            store.append("b", actions[i : i + 7])  # the same chat: every blob shared
        _counts_match_the_snapshots(db_url)
        blobs = _rows(db_url, "SELECT count(*) FROM snapshot_blobs")[0][0]
        versions = [v for (v,) in _rows(db_url, "SELECT version FROM snapshots s JOIN sessions x ON x.pk = s.session_pk WHERE x.id = 'a' ORDER BY 1")]
        store.seal()
        kept = [v for (v,) in _rows(db_url, "SELECT version FROM snapshots s JOIN sessions x ON x.pk = s.session_pk WHERE x.id = 'a' ORDER BY 1")]
        sealed_to = _rows(db_url, "SELECT max(g.last_version) FROM event_segments g JOIN sessions x ON x.pk = g.session_pk WHERE x.id = 'a'")[0][0]
        every = sealer.SEALED_SNAPSHOT_SPACING * EVERY
        assert kept == [v for v in versions if v > sealed_to or v % every == 0 or v == max(versions)]
        assert len(kept) < len(versions)
        _counts_match_the_snapshots(db_url)
        assert _rows(db_url, "SELECT count(*) FROM snapshot_blobs")[0][0] < blobs
        for s in ("a", "b"):
            for v in range(0, len(actions) + 1, 5):
                assert store.load(s, version=v).to_json() == fold(actions[:v]).to_json()
        assert store.load("a-fork").to_json() == fold(actions[:100] + chat_session(2, seed=12)).to_json()
        assert store.verify().ok
        store.erase("a", reason="test")
        store.erase("b", reason="test")
        _counts_match_the_snapshots(db_url)
        assert _rows(db_url, "SELECT count(*) FROM snapshot_blobs") == [(0,)]


def test_a_group_commit_of_sessions_sharing_blobs_counts_each_reference(db_url: str) -> None:
    # Four sessions of the same chat, appended together: their snapshots name the same
    # blobs in one grouped statement (PostgreSQL: one row per blob, every reference counted).
    actions = chat_session(2, seed=31)

    async def scenario() -> None:
        store = AsyncEventStore(db_url, snapshot_every=4, seal=False)
        await store.migrate()
        async with store:
            for i in range(0, len(actions), 3):
                await asyncio.gather(*(store.append(f"s{k}", actions[i : i + 3]) for k in range(4)))
            for k in range(4):
                assert (await store.load(f"s{k}")).to_json() == fold(actions).to_json()

    asyncio.run(scenario())
    _counts_match_the_snapshots(db_url)
    assert max(n for (n,) in _rows(db_url, "SELECT refs FROM snapshot_blobs")) >= 4


def _blocked(url: str, entered: threading.Event) -> Callable[[], bool]:
    """Whether the other thread waits: on PostgreSQL for a row lock, on SQLite (one writer)
    once it has started its write transaction."""
    if not url.startswith("postgresql"):
        return entered.is_set
    return lambda: entered.is_set() and bool(
        _rows(url, "SELECT count(*) FROM pg_locks WHERE NOT granted")[0][0]
    )


@pytest.fixture
def sealed_pair(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Session ``a`` sealed with all its snapshots (none thinned yet), and ``b``, the same
    chat without snapshots; ``digest``: a blob only ``a``'s snapshot at ``version`` names."""
    actions = chat_session(4, seed=21)
    monkeypatch.setattr(sealer, "SEALED_SNAPSHOT_SPACING", 1)  # keep them all, for now
    with make_store(db_url, snapshot_every=EVERY, seal=False) as store:
        for i in range(0, len(actions), 7):
            store.append("a", actions[i : i + 7])
        assert store.seal() > 0
    with make_store(db_url, snapshot_every=10**6, seal=False) as store:
        store.append("b", actions)
    snaps = _rows(
        db_url,
        "SELECT s.version, s.message_digests FROM snapshots s JOIN sessions x ON x.pk = s.session_pk "
        "WHERE x.id = 'a' ORDER BY 1",
    )
    newest = set(_digests(bytes(snaps[-1][1])))
    version, md = snaps[0][0], bytes(snaps[0][1])
    digest = next(d for d in reversed(_digests(md)) if d not in newest)
    (pk_a,), (pk_b,) = (_rows(db_url, "SELECT pk FROM sessions WHERE id = :s", s=s)[0] for s in ("a", "b"))
    storage = open_storage(db_url)
    try:
        yield {
            "url": db_url, "storage": storage, "actions": actions, "version": version,
            "digest": digest, "a": pk_a, "b": pk_b, "sealed_to": snaps[-1][0],
        }
    finally:
        storage.close()


def _write_b(p: dict[str, Any], tx: Any) -> None:
    """Store ``b``'s snapshot at the version, naming (and sending) the contested blob."""
    state = fold(p["actions"][: p["version"]]).to_json()
    rest, digests, blobs = SnapshotCodec().encode(state)
    assert p["digest"] in _digests(digests)
    p["storage"].put_snapshot(tx, SnapshotRow(p["b"], p["version"], REDUCER_VERSION, rest, digests), blobs)


def _thin_a(p: dict[str, Any], tx: Any) -> None:
    """Delete every snapshot of ``a`` inside its sealed turns but the newest."""
    assert p["storage"].thin_snapshots(tx, p["a"], first=1, last=p["sealed_to"], keep_every=10**6) > 0


@pytest.mark.parametrize("first", ["writer", "collector"])
def test_a_blob_reused_while_its_last_snapshot_goes_is_kept(sealed_pair: dict[str, Any], first: str) -> None:
    p = sealed_pair
    st = p["storage"]
    assert _rows(p["url"], "SELECT refs FROM snapshot_blobs WHERE digest = :d", d=p["digest"]) == [(1,)]
    held, other = (_write_b, _thin_a) if first == "writer" else (_thin_a, _write_b)
    entered = threading.Event()
    failed: list[BaseException] = []

    def second() -> None:
        try:
            entered.set()
            with st.write() as tx:
                other(p, tx)
        except BaseException as exc:  # reported by the test's thread
            failed.append(exc)

    with ExitStack() as stack:
        tx = stack.enter_context(st.write())
        held(p, tx)  # uncommitted: its blob row is locked (PostgreSQL) or the database is
        t = threading.Thread(target=second)
        t.start()
        wait_until(_blocked(p["url"], entered), "the second transaction to wait for the first")
    t.join(timeout=60)
    assert not t.is_alive() and not failed, failed
    # b's snapshot names the blob: it is stored, counted once, and loads read through it.
    assert _rows(p["url"], "SELECT refs FROM snapshot_blobs WHERE digest = :d", d=p["digest"]) == [(1,)]
    _counts_match_the_snapshots(p["url"])
    with make_store(p["url"], seal=False) as store:
        v = p["version"]
        assert store.load("b", version=v).to_json() == fold(p["actions"][:v]).to_json()
        assert store.load("a", version=v).to_json() == fold(p["actions"][:v]).to_json()
        assert store.verify().ok
