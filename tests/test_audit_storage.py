"""The storage side of the audit trail: no REPLACE of events, a permit lookup that cannot be
shadowed, compaction records bound to the chain, erasure with tombstones, blob collection."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError

from conftest import make_store
from eventstore.core.codec import state_digest
from eventstore.errors import ConcurrencyError, SessionErased, StorageError
from eventstore.samples import chat_session
from eventstore.core.segments import SegmentCodec
from eventstore.storage import open_storage
from eventstore.core.rows import HASH_SIZE, CompactionRow, NewSession, TombstoneRow
from eventstore.storage.interface import Storage
from eventstore import EventStore
from eventstore.engine.engine import Engine as StoreEngine

NOW = 1_796_040_000_000_000  # microseconds, a fixed instant


@pytest.fixture
def storage(db_url: str, store: EventStore) -> Iterator[Storage]:
    """Storage on the same (migrated) database as ``store``."""
    st = open_storage(db_url, segment_coder=SegmentCodec())  # what the engine hands its storage
    try:
        yield st
    finally:
        st.close()


def _pk(storage: Storage, session: str) -> int:
    with storage.read() as tx:
        row = storage.session(tx, id=session)
    assert row is not None
    return row.pk


def _count(engine: Engine, sql: str, **params: object) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar() or 0)


# -- break 3: an INSERT never replaces a recorded event -----------------------------------


@pytest.mark.parametrize("clash", ["version", "event_id"])
def test_replace_into_events_is_refused(
    store: EventStore, raw_engine: Engine, backend: str, clash: str
) -> None:
    store.append("s1", [{"type": "stop"}, {"type": "retry"}], event_ids=["a", "b"])
    before = [e.to_json() for e in store.history("s1")]
    version, event_id = (1, "z") if clash == "version" else (3, "a")
    if backend == "sqlite":
        verbs = ["INSERT OR REPLACE INTO", "REPLACE INTO"]
        conflict = ""
    else:  # PostgreSQL has no REPLACE; its upsert is an UPDATE, which the guard refuses.
        verbs = ["INSERT INTO"]
        target = "(session_pk, version)" if clash == "version" else "(session_pk, event_id) WHERE event_id IS NOT NULL"
        conflict = f" ON CONFLICT {target} DO UPDATE SET payload = excluded.payload, hash = excluded.hash"
    for verb in verbs:
        with pytest.raises(DBAPIError, match="immutable"):
            with raw_engine.begin() as conn:
                conn.execute(
                    text(
                        f"{verb} events (session_pk, version, event_id, type, turn, payload, "
                        "recorded_at, actor, metadata, hash) "
                        "SELECT session_pk, :v, :eid, type, turn, :p, recorded_at, actor, "
                        f"metadata, hash FROM events WHERE version = 1{conflict}"
                    ),
                    {"v": version, "eid": event_id, "p": b"{}"},
                )
    assert [e.to_json() for e in store.history("s1")] == before
    assert store.verify("s1").ok


def test_replace_into_events_naming_a_recorded_feed_number_is_refused_on_sqlite(tmp_path: Path) -> None:
    # SQLite only: there the feed number is the rowid, which REPLACE would free by deleting
    # its row; on PostgreSQL it is a plain column that transactions share.
    url = f"sqlite:///{tmp_path / 'events.db'}"
    with make_store(url) as store:
        store.append("s1", [{"type": "stop"}, {"type": "retry"}])
        store.append("s2", [{"type": "stop"}])
        before = [e.to_json() for e in store.feed(idle_timeout=0)]
        engine = create_engine(url)
        for verb in ("INSERT OR REPLACE INTO", "REPLACE INTO"):
            with pytest.raises(DBAPIError, match="immutable"):
                with engine.begin() as conn:
                    conn.execute(
                        text(
                            f"{verb} events (session_pk, version, event_id, type, turn, payload, "
                            "recorded_at, actor, metadata, hash, xact) "
                            "SELECT session_pk, 3, NULL, type, turn, payload, recorded_at, actor, "
                            "metadata, hash, xact FROM events WHERE version = 1 AND xact = 1"
                        )
                    )
        engine.dispose()
        assert [e.to_json() for e in store.feed(idle_timeout=0)] == before
        assert store.verify("s1").ok


def test_a_taken_version_is_still_a_concurrency_error(
    store: EventStore, storage: Storage
) -> None:
    # The insert trigger answers before the primary key does; the error stays the same.
    store.append("s1", [{"type": "stop"}])
    pk = _pk(storage, "s1")
    with storage.read() as tx:
        (ev,) = storage.read_events(tx, pk, after=0, upto=1)
    assert ev is not None
    with pytest.raises(ConcurrencyError):
        with storage.write(session="s1", expected=0) as tx:
            storage.insert_events(tx, [ev])
    assert store.head("s1") == 1


# -- the permit table cannot be shadowed by a TEMP table ----------------------------------


def test_a_temp_permit_table_does_not_open_the_delete_guard(
    store: EventStore, raw_engine: Engine
) -> None:
    store.append("s1", [{"type": "stop"}, {"type": "retry"}])
    with pytest.raises(DBAPIError, match="immutable"):
        with raw_engine.begin() as conn:
            conn.execute(text("CREATE TEMP TABLE compaction_permits (session_pk int, upto int)"))
            conn.execute(text("INSERT INTO compaction_permits SELECT pk, 1000 FROM sessions"))
            conn.execute(text("DELETE FROM events"))
    assert store.head("s1") == 2 and len(list(store.history("s1"))) == 2


# -- compaction records --------------------------------------------------------------------


def _record(steps: StoreEngine, pk: int, upto: int, digest: bytes, now: int) -> CompactionRow:
    """What a compaction of session row ``pk`` up to ``upto`` records, written."""
    with steps.storage.write() as tx:
        rec = steps.removed_record(tx, steps.session_by_pk(tx, pk), upto, digest, now, None)
        steps.storage.insert_compaction(tx, rec)
    return rec


def test_a_compaction_record_keeps_the_hashes_it_removes(
    store: EventStore, storage: Storage, raw_engine: Engine, db_url: str
) -> None:
    store.append("s1", chat_session(turns=3, seed=2))
    pk = _pk(storage, "s1")
    hashes = {e.version: e.hash for e in store.history("s1")}
    digest = hashlib.sha256(b"state at 20").digest()
    state_20 = store.load("s1", version=20).to_json()
    store.compact("s1", upto=20, actor="ops")  # the compaction writes its record
    with storage.read() as tx:
        (rec,) = storage.records(tx, CompactionRow, session_pk=pk)
    assert (rec.upto, rec.previous_baseline, rec.first_version, rec.actor) == (20, 0, 1, "ops")
    assert len(rec.removed_hashes) == 20 * HASH_SIZE
    assert rec.baseline_hash.hex() == hashes[20]
    assert rec.state_digest == state_digest(state_20)
    with storage.read() as tx:
        assert storage.read_events(tx, pk, after=9, upto=10) == []  # the row is gone...
        assert storage.recorded_hash(tx, pk, 10).hex() == hashes[10]  # ...its hash is kept
        assert storage.recorded_hash(tx, pk, 25).hex() == hashes[25]
        assert storage.recorded_hash(tx, pk, 10_000) is None
        assert storage.records(tx, CompactionRow, session_pk=pk) == [rec]
    # A second compaction starts where the first stopped.
    steps = StoreEngine(db_url)
    try:
        rec2 = _record(steps, pk, 30, digest, NOW + 1)
        assert (rec2.previous_baseline, rec2.first_version) == (20, 21)
        assert rec2.hash_at(30) is not None and rec2.hash_at(30).hex() == hashes[30]
        assert rec2.hash_at(20) is None
        # Events that are gone cannot be recorded after the fact.
        with pytest.raises(StorageError, match="not all there"):
            _record(steps, pk, 15, digest, NOW)
    finally:
        steps.close()
    assert _count(raw_engine, "SELECT count(*) FROM compactions") == 2
    # An import writes the record it brings along as given; the same upto twice is refused.
    imported = replace(rec2, upto=40, previous_baseline=30, first_version=41, removed_hashes=b"")
    with storage.write() as tx:
        storage.insert_compaction(tx, imported)
    with storage.read() as tx:
        assert storage.records(tx, CompactionRow, session_pk=pk)[-1] == imported
        assert imported.hash_at(40) is None
    with pytest.raises(StorageError):
        with storage.write() as tx:
            storage.insert_compaction(tx, imported)


# -- erasure ------------------------------------------------------------------------------


def test_erase_removes_a_session_and_its_branches_and_leaves_tombstones(
    raw_engine: Engine, db_url: str
) -> None:
    store = make_store(db_url, snapshot_every=8)
    storage = open_storage(db_url)
    try:
        store.append("s1", chat_session(turns=3, seed=4))
        store.append("keep", chat_session(turns=3, seed=4))  # shares every blob with s1
        store.append("solo", chat_session(turns=2, seed=9))
        b1 = store.branch("s1", at=20, new_id="b1")
        store.append(b1, [{"type": "stop"}])
        b2 = store.branch(b1, at=21, new_id="b2")
        store.append(b2, [{"type": "retry"}])
        store.compact("s1", upto=16)
        heads = {s: (store.head(s), next(iter(store.history(s, desc=True))).hash) for s in ("s1", "b1", "b2")}
        blobs_before = _count(raw_engine, "SELECT count(*) FROM snapshot_blobs")
        keep_state = store.load("keep").to_json()

        pk = _pk(storage, "s1")
        with storage.write() as tx:
            assert [r.id for r in storage.sessions(tx, descendants_of=pk)] == ["b1", "b2"]
            erasure = storage.erase_session(tx, pk, erased_at=NOW, actor="admin:kim", reason="user request")
        assert [(t.session_id, t.erased_with) for t in erasure.tombstones] == [
            ("s1", None), ("b1", "s1"), ("b2", "s1")
        ]
        for t in erasure.tombstones:
            assert (t.head, t.head_hash.hex()) == heads[t.session_id]
            assert (t.erased_at, t.actor, t.reason) == (NOW, "admin:kim", "user request")
        assert erasure.events > 0 and erasure.snapshots > 0 and erasure.blob_candidates

        with storage.read() as tx:
            assert storage.session(tx, id="s1") is None and storage.session(tx, id="b2") is None
            assert storage.records(tx, TombstoneRow, session_id="b1") == [erasure.tombstones[1]]
            assert storage.records(tx, TombstoneRow, session_id="keep") == []
            assert [t.session_id for t in storage.records(tx, TombstoneRow)] == ["b1", "b2", "s1"]
        for table in ("events", "snapshots", "compactions"):
            left = _count(
                raw_engine,
                f"SELECT count(*) FROM {table} WHERE session_pk NOT IN (SELECT pk FROM sessions)",
            )
            assert left == 0, table
        assert _count(raw_engine, "SELECT count(*) FROM compaction_permits") == 0

        # Blobs: those "keep" still uses stay; the ones nothing references went with the
        # snapshots, and every count is what the remaining snapshots name.
        assert _count(raw_engine, "SELECT count(*) FROM snapshot_blobs") <= blobs_before
        _assert_counts(raw_engine)
        assert store.load("keep").to_json() == keep_state
        assert store.verify().ok
        assert {s.id for s in store.sessions()} == {"keep", "solo"}

        # An id erased once cannot be erased (tombstoned) again.
        with pytest.raises(SessionErased):  # the store never reuses an erased id
            store.append("b1", [{"type": "stop"}])
        with storage.write() as tx:  # written behind its back, the storage still refuses
            storage.insert_session(tx, NewSession(id="b1", created_at=NOW))
        with pytest.raises(StorageError):
            with storage.write() as tx:
                storage.erase_session(tx, _pk(storage, "b1"), erased_at=NOW, actor=None, reason="again")
        assert store.head("b1") == 0
    finally:
        storage.close()
        store.close()


def _assert_counts(raw_engine: Engine) -> None:
    """Every blob is counted as many times as the snapshots name it (and none at 0 is left)."""
    with raw_engine.connect() as conn:
        named: dict[bytes, int] = {}
        for (md,) in conn.execute(text("SELECT message_digests FROM snapshots")):
            for i in range(0, len(md), 16):
                named[bytes(md[i : i + 16])] = named.get(bytes(md[i : i + 16]), 0) + 1
        counts = {bytes(d): n for d, n in conn.execute(text("SELECT digest, refs FROM snapshot_blobs"))}
    assert counts == named


def test_compaction_deletes_the_blobs_only_its_snapshots_named(
    store: EventStore, storage: Storage, raw_engine: Engine
) -> None:
    store.append("s1", chat_session(turns=2, seed=1))
    store.append("s2", chat_session(turns=2, seed=1))  # shares every blob with s1
    store.append("s3", chat_session(turns=2, seed=2))
    _assert_counts(raw_engine)
    total = _count(raw_engine, "SELECT count(*) FROM snapshot_blobs")
    store.compact("s1", upto=store.head("s1") - 10)  # s2 still names every blob of s1's
    _assert_counts(raw_engine)
    assert _count(raw_engine, "SELECT count(*) FROM snapshot_blobs") >= total
    store.compact("s3", upto=store.head("s3") - 10)  # named by s3 alone: they go
    _assert_counts(raw_engine)
    assert store.verify().ok


# -- revision 0002 on a database that already holds events --------------------------------


def test_revision_0002_upgrades_and_downgrades_a_populated_database(
    db_url: str, raw_engine: Engine
) -> None:
    from alembic import command

    from eventstore.storage.migrate import alembic_config

    # Populated, then taken back to 0001 (this version's store writes only its own schema:
    # a new session's id is checked against the tombstones).
    with EventStore(db_url) as old:
        old.migrate()
        old.append("s1", [{"type": "stop"}, {"type": "retry"}])
    with raw_engine.begin() as conn:
        command.downgrade(alembic_config(conn), "0001")
    with EventStore(db_url) as store:
        store.migrate()
        assert store.verify().ok and store.head("s1") == 2
        with raw_engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM tombstones")).scalar() == 0
        with raw_engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0001")
        # Back at 0001: the audit tables are gone, the guard of 0001 still refuses deletes.
        with pytest.raises(DBAPIError, match="immutable"):
            with raw_engine.begin() as conn:
                conn.execute(text("DELETE FROM events"))
        with raw_engine.connect() as conn:
            with pytest.raises(DBAPIError):
                conn.execute(text("SELECT count(*) FROM tombstones"))
        store.migrate()
        store.append("s1", [{"type": "stop"}])
        assert store.verify().ok and store.head("s1") == 3
